package outbox_test

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// Twins are the other rows to the number with the same text (as a lookup
// compares it) whose attempt may have made a message since the time asked:
// sending, queued after an attempt that may have reached the provider,
// sent, delivered, undelivered, unknown, changed since then. Not the row
// itself, not dead, pending or plainly queued rows, not older changes,
// other numbers or other texts. Read as the senders' role.
func TestTwins(t *testing.T) {
	t.Parallel()
	admin, dsn := pgtest.NewPool(t)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, dsn, "sendonce_sender"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	const to, text = "+15551234567", "Your parcel arrives today.\nReply STOP to opt out."
	now := time.Now()
	since := now.Add(-time.Minute)
	type row struct {
		name, to, body, status, ref string
		maybe                       bool
		age                         time.Duration
		twin                        bool
	}
	rows := []row{
		{name: "self", status: "sending"},
		{name: "sending", status: "sending", twin: true},
		{name: "queued after a lost answer", status: "queued", maybe: true, twin: true},
		{name: "queued, nothing reached the provider", status: "queued"},
		{name: "sent with its sid", status: "sent", ref: "SMsent", twin: true},
		{name: "sent, sid unknown", status: "sent", twin: true},
		{name: "delivered, CRLF text", body: "Your parcel arrives today.\r\nReply STOP to opt out.\r\n", status: "delivered", ref: "SMdel", twin: true},
		{name: "undelivered", status: "undelivered", ref: "SMundel", twin: true},
		{name: "unknown", status: "unknown", twin: true},
		{name: "dead", status: "dead"},
		{name: "pending", status: "pending"},
		{name: "sent before since", status: "sent", ref: "SMold", age: 10 * time.Minute},
		{name: "unknown before since", status: "unknown", age: 2 * time.Minute},
		{name: "another number", to: "+15557654321", status: "sent"},
		{name: "another text", body: "Your parcel arrives tomorrow.", status: "sent"},
	}
	ids := make([]uuid.UUID, len(rows))
	want := map[uuid.UUID]outbox.Twin{}
	for i, r := range rows {
		ids[i] = uuid.New()
		reason := map[string]any{"dead": "permanent", "unknown": "ambiguous"}[r.status]
		var ref any
		if r.ref != "" {
			ref = r.ref
		}
		exec(t, admin, `INSERT INTO sms_outbox (id, to_e164, body, status, provider_ref, maybe_accepted, end_reason, attempt_count, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8)`,
			ids[i], cmp.Or(r.to, to), cmp.Or(r.body, text), r.status, ref, r.maybe, reason, now.Add(-r.age))
		if r.twin {
			want[ids[i]] = outbox.Twin{ID: ids[i], Status: outbox.State(r.status), ProviderRef: r.ref}
		}
	}
	got, err := outbox.Twins(ctx, pool, ids[0], to, text, since)
	if err != nil {
		t.Fatal(err)
	}
	for _, tw := range got {
		if w, ok := want[tw.ID]; !ok || w != tw {
			t.Errorf("twin %s (%s) = %+v, want %+v", rows[slices.Index(ids, tw.ID)].name, tw.ID, tw, w)
		}
		delete(want, tw.ID)
	}
	for id := range want {
		t.Errorf("%s is missing", rows[slices.Index(ids, id)].name)
	}

	// A claim stamps updated_at: a row claimed now is a twin of a lookup
	// from now on, whatever it was before.
	exec(t, admin, `UPDATE sms_outbox SET updated_at = now() - interval '1 hour', status = 'queued', next_attempt_at = now() WHERE id = $1`, ids[3])
	claimOne(t, admin, ids[3], uuid.New())
	got, err = outbox.Twins(ctx, pool, ids[0], to, text, time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(got, func(tw outbox.Twin) bool { return tw.ID == ids[3] && tw.Status == outbox.StatusSending }) {
		t.Errorf("a row claimed just now is not a twin: %+v", got)
	}
}
