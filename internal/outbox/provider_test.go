package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// A claim names the provider of a row that has none: the preferred one for
// a row never attempted, the primary for a row attempted before rows named
// their provider. A row that has one keeps it, whatever is preferred now;
// only Repin, under the row's claim, moves it.
func TestClaimNamesTheProvider(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	fresh := enqueue(t, pool, "+15551234567", "a")
	legacy := enqueue(t, pool, "+15551234568", "b")
	named := enqueue(t, pool, "+15551234569", "c")
	exec(t, pool, `UPDATE sms_outbox SET status='queued', attempt_count=1 WHERE id = $1`, legacy)
	exec(t, pool, `UPDATE sms_outbox SET provider='twilio' WHERE id = $1`, named)

	token := uuid.New()
	cs, err := outbox.ClaimForSendTo(ctx, pool, []uuid.UUID{fresh, legacy, named}, nil, time.Minute, token,
		outbox.Providers{Preferred: "vonage", Primary: "twilio2"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]string{fresh: "vonage", legacy: "twilio2", named: "twilio"}
	for _, c := range cs {
		if c.Result != outbox.Claimed || c.Provider != want[c.ID] {
			t.Errorf("claim of %s: %v, provider %q; want claimed, provider %q", c.ID, c.Result, c.Provider, want[c.ID])
		}
	}

	// Repin is fenced on the claim and on the provider the row names.
	if ok, err := outbox.Repin(ctx, pool, fresh, uuid.New(), "vonage", "telnyx"); err != nil || ok {
		t.Fatalf("repin under another claim: %v, %v; want refused", ok, err)
	}
	if ok, err := outbox.Repin(ctx, pool, fresh, token, "twilio", "telnyx"); err != nil || ok {
		t.Fatalf("repin from a provider the row does not name: %v, %v; want refused", ok, err)
	}
	if ok, err := outbox.Repin(ctx, pool, fresh, token, "vonage", "telnyx"); err != nil || !ok {
		t.Fatalf("repin under the claim: %v, %v; want done", ok, err)
	}
	var p string
	if err := pool.QueryRow(ctx, `SELECT provider FROM sms_outbox WHERE id = $1`, fresh).Scan(&p); err != nil || p != "telnyx" {
		t.Fatalf("row's provider %q, %v; want telnyx", p, err)
	}

	// Each attempt records its provider, and Attempts shows it.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.ApplyResults(ctx, tx, []outbox.Result{{ID: fresh, Status: outbox.StatusQueued, Token: token, RetryIn: time.Second}},
			[]outbox.Attempt{{OutboxID: fresh, Number: 1, StartedAt: time.Now(), Outcome: "retry", Provider: "telnyx"}}, false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	as, err := outbox.Attempts(ctx, pool, fresh)
	if err != nil || len(as) != 1 || as[0].Provider != "telnyx" {
		t.Fatalf("attempts %+v, %v; want one at telnyx", as, err)
	}
}
