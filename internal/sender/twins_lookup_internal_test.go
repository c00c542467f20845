package sender

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// Two rows with the same text to the same number, at the stub's Twilio
// facade and on a real database. Row A's attempt reached Twilio and lost
// its answer. Row B's lookup (B was never sent) finds A's message: alone,
// the lookup would settle B sent with it, and B's text would never go out.
// With A as B's twin (no sid known) the answer is not settleable; once A's
// status callback has given its sid, B's lookup is "none" (B is sent).
// Then A's own lookup, with its sid known, finds its message beside B's
// and takes its own.
func TestTwinsLeaveALookupOpen(t *testing.T) {
	t.Parallel()
	admin, dsn := pgtest.NewPool(t)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, dsn, "sendonce_sender"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	stub, err := smsstub.New(smsstub.Config{IgnoreKeys: true,
		Twilio: smsstub.Twilio{AccountSID: "AC1", AuthToken: "tok", QueueFor: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(stub.Handler())
	t.Cleanup(ts.Close)
	t.Cleanup(func() { _ = stub.Close() })
	c, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: ts.URL, AccountSID: "AC1", AuthToken: "tok",
		From: "+15550001111", Lookup: true, Timeout: 5 * time.Second, ReceiptsURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const to, text = "+15551234567", "Your table is ready."
	a, b := uuid.New(), uuid.New()
	var createdB time.Time
	for _, id := range []uuid.UUID{a, b} {
		if err := admin.QueryRow(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count)
			VALUES ($1, $2, $3, 'sending', 1) RETURNING created_at`, id, to, text).Scan(&createdB); err != nil {
			t.Fatal(err)
		}
	}

	// A's attempt: taken by Twilio, its answer lost.
	if err := stub.SetFaults(smsstub.Faults{WithholdRate: 1, WithholdMode: smsstub.WithholdClose}); err != nil {
		t.Fatal(err)
	}
	if o := c.Send(ctx, provider.Message{Key: a.String(), To: to, Body: text}); o.Kind != provider.Ambiguous {
		t.Fatalf("A's attempt: %+v, want its answer lost", o)
	}
	if err := stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `UPDATE sms_outbox SET status = 'queued', maybe_accepted = true, lookup_pending = true
		WHERE id = $1`, a); err != nil {
		t.Fatal(err)
	}

	lookup := func(id uuid.UUID, ownRef string) ([]provider.Found, []provider.Found, bool) {
		t.Helper()
		q := provider.LookupQuery{Reference: id.String(), To: to, Body: text, Since: createdB}
		res := c.Lookup(ctx, q)
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		twins, err := outbox.Twins(ctx, pool, id, to, text, twinsSince(q.Since, res.Found, c.Timeout()))
		if err != nil {
			t.Fatal(err)
		}
		mine, ok := attribute(res.Found, ownRef, twins)
		return res.Found, mine, ok
	}
	found, _, ok := lookup(b, "")
	if len(found) != 1 {
		t.Fatalf("B's lookup found %d messages, want A's", len(found))
	}
	if ok {
		t.Fatal("B's lookup settles on A's message: B would never be sent")
	}
	sidA := found[0].Ref

	// A's status callback: sent, with its sid.
	err = pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		_, err := outbox.ApplyReceipts(ctx, tx, []outbox.Receipt{{ID: a, Status: outbox.StatusSent, ProviderRef: sidA, Source: "twilio"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if found, mine, ok := lookup(b, ""); len(found) != 1 || !ok || len(mine) != 0 {
		t.Fatalf("B's lookup after A's callback: found %v, mine %v, settleable %v; want none of them B's", found, mine, ok)
	}

	// B is sent now; A, its sid known, looks up: two messages, one its own.
	o := c.Send(ctx, provider.Message{Key: b.String(), To: to, Body: text})
	if o.Kind != provider.Sent {
		t.Fatalf("B's send: %+v", o)
	}
	if found, mine, ok := lookup(a, sidA); len(found) != 2 || !ok || len(mine) != 1 || mine[0].Ref != sidA {
		t.Fatalf("A's lookup: found %v, mine %v, settleable %v; want its own only", found, mine, ok)
	}
}
