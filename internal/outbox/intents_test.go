package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// A scheduled row was published no sooner than its send time: its claim
// counts its age from there, not from its insert (a row written two days
// before its send time is not older than the broker's memory, nor than the
// provider's lookups' retention).
func TestAScheduledRowIsAsOldAsItsSendTime(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	id := enqueue(t, pool, "+15551234567", "reminder")
	exec(t, pool, `UPDATE sms_outbox SET created_at = now() - interval '2 days' WHERE id = $1`, id)
	exec(t, pool, `ALTER TABLE sms_outbox DISABLE TRIGGER sms_outbox_immutable_intent`)
	exec(t, pool, `UPDATE sms_outbox SET send_at = now() - interval '1 second' WHERE id = $1`, id)
	exec(t, pool, `ALTER TABLE sms_outbox ENABLE TRIGGER sms_outbox_immutable_intent`)
	c := claimOne(t, pool, id, uuid.New())
	if c.Result != outbox.Claimed || c.Age > time.Minute || c.Age < 0 {
		t.Fatalf("claim: %v, age %s; want claimed, about a second old", c.Result, c.Age)
	}
}

// The claim ends an unmarked row past its expiry expired, in the same
// statement; not one a call may have reached, and not a redelivery whose
// previous delivery the row does not account for (a claim a failover may
// have lost with its call): those are claimed, for the sender to settle.
func TestTheClaimExpiresOnlyWhatNoCallCanHaveTaken(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	past := time.Now().Add(-time.Minute)
	fresh := enqueue(t, pool, "+15551230001", "a")
	marked := enqueue(t, pool, "+15551230002", "b")
	lost := enqueue(t, pool, "+15551230003", "c")
	exec(t, pool, `ALTER TABLE sms_outbox DISABLE TRIGGER sms_outbox_immutable_intent`)
	exec(t, pool, `UPDATE sms_outbox SET expires_at = $2 WHERE id = ANY($1)`, []uuid.UUID{fresh, marked, lost}, past)
	exec(t, pool, `ALTER TABLE sms_outbox ENABLE TRIGGER sms_outbox_immutable_intent`)
	exec(t, pool, `UPDATE sms_outbox SET status = 'queued', attempt_count = 1, maybe_accepted = true WHERE id = $1`, marked)
	// lost: delivery 3 of message 7 arrives; the row shows delivery 1's claim.
	exec(t, pool, `UPDATE sms_outbox SET status = 'queued', attempt_count = 1, claim_seq = 7, claim_delivery = 1 WHERE id = $1`, lost)
	cs, err := outbox.ClaimForSend(ctx, pool, []uuid.UUID{fresh, marked, lost},
		[]outbox.Delivery{{Seq: 5, Count: 1}, {Seq: 6, Count: 2}, {Seq: 7, Count: 3}}, time.Minute, uuid.New())
	if err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]outbox.ClaimResult{fresh: outbox.Expired, marked: outbox.Claimed, lost: outbox.Claimed}
	for _, c := range cs {
		if c.Result != want[c.ID] {
			t.Errorf("row %s: claim %v, want %v", c.ID, c.Result, want[c.ID])
		}
		if c.Result == outbox.Claimed && (c.ExpiresAt.IsZero() || c.ExpiresLeft > 0) {
			t.Errorf("row %s: expiry %s, %s left; want its past expiry", c.ID, c.ExpiresAt, c.ExpiresLeft)
		}
	}
	if st := status(t, pool, fresh); st.Status != outbox.StatusExpired || st.Attempts != 0 {
		t.Errorf("the unmarked row: %s, %d attempts; want expired with none", st.Status, st.Attempts)
	}
}

// An expired result the database does not agree with (the sender's clock
// runs ahead of the database's, or the row was marked meanwhile) never
// fails the status write: the row waits, parked, for the claim after its
// expiry by the database's clock.
func TestAnEarlyExpiredResultWaitsForTheExpiry(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	early := enqueue(t, pool, "+15551230011", "a")
	due := enqueue(t, pool, "+15551230012", "b")
	exp := time.Now().Add(time.Hour)
	exec(t, pool, `ALTER TABLE sms_outbox DISABLE TRIGGER sms_outbox_immutable_intent`)
	exec(t, pool, `UPDATE sms_outbox SET expires_at = $2 WHERE id = $1`, early, exp)
	exec(t, pool, `UPDATE sms_outbox SET expires_at = now() + interval '2 seconds' WHERE id = $1`, due)
	exec(t, pool, `ALTER TABLE sms_outbox ENABLE TRIGGER sms_outbox_immutable_intent`)
	a, b := claimOne(t, pool, early, uuid.New()), claimOne(t, pool, due, uuid.New())
	if a.Result != outbox.Claimed || b.Result != outbox.Claimed {
		t.Fatalf("claims: %v, %v; want both claimed before their expiry", a.Result, b.Result)
	}
	time.Sleep(time.Until(b.ExpiresAt) + 100*time.Millisecond)
	sender := rolePool(t, url, "sendonce_sender")
	written := write(t, sender, false,
		outbox.Result{ID: early, Status: outbox.StatusExpired, Token: a.Token, Refund: true, Attempt: a.Attempt, Error: "expired"},
		outbox.Result{ID: due, Status: outbox.StatusExpired, Token: b.Token, Refund: true, Attempt: b.Attempt, Error: "expired"})
	if len(written) != 2 {
		t.Fatalf("written %v, want both rows (early %s: %+v, due %s: %+v)", written, early, status(t, pool, early), due, status(t, pool, due))
	}
	var st string
	var next time.Time
	var seq *int64
	if err := pool.QueryRow(context.Background(), `SELECT status, next_attempt_at, stream_seq FROM sms_outbox WHERE id = $1`, early).Scan(&st, &next, &seq); err != nil {
		t.Fatal(err)
	}
	if st != "queued" || next.Before(exp.Add(-time.Second)) || seq != nil {
		t.Errorf("the row not yet expired: %s, due %s, stream seq %v; want queued, parked until its expiry", st, next, seq)
	}
	if got := status(t, pool, due); got.Status != outbox.StatusExpired {
		t.Errorf("the row past its expiry: %s, want expired", got.Status)
	}
}

// What a stolen component login cannot do with the new moves: a sender's
// claim of a row past its expiry (or not yet due) is skipped, not made;
// the relay cannot expire a row a call was counted for, even after
// clearing its marks.
func TestLoginsCannotSkipTime(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	ctx := context.Background()
	expired := enqueue(t, pool, "+15551230021", "a")
	later := enqueue(t, pool, "+15551230022", "b")
	tried := enqueue(t, pool, "+15551230023", "c")
	exec(t, pool, `ALTER TABLE sms_outbox DISABLE TRIGGER sms_outbox_immutable_intent`)
	exec(t, pool, `UPDATE sms_outbox SET expires_at = now() - interval '1 minute' WHERE id = ANY($1)`, []uuid.UUID{expired, tried})
	exec(t, pool, `UPDATE sms_outbox SET send_at = now() + interval '1 hour' WHERE id = $1`, later)
	exec(t, pool, `ALTER TABLE sms_outbox ENABLE TRIGGER sms_outbox_immutable_intent`)
	exec(t, pool, `UPDATE sms_outbox SET status = 'queued', attempt_count = 1, maybe_accepted = true WHERE id = $1`, tried)

	sender := rolePool(t, url, "sendonce_sender")
	tag, err := sender.Exec(ctx, `UPDATE sms_outbox SET status = 'sending' WHERE id = ANY($1)`, []uuid.UUID{expired, later})
	if err != nil || tag.RowsAffected() != 0 {
		t.Errorf("a sender's own claim of an expired and a scheduled row: %d moved, %v; want none, no error", tag.RowsAffected(), err)
	}
	relay := rolePool(t, url, "sendonce_relay")
	if _, err := relay.Exec(ctx, `UPDATE sms_outbox SET maybe_accepted = false, lookup_pending = false WHERE id = $1`, tried); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Exec(ctx, `UPDATE sms_outbox SET status = 'expired' WHERE id = $1`, tried); err == nil {
		t.Error("the relay expired a row a call was counted for")
	}
	for id, want := range map[uuid.UUID]outbox.State{expired: outbox.StatusPending, later: outbox.StatusPending, tried: outbox.StatusQueued} {
		if st := status(t, pool, id); st.Status != want {
			t.Errorf("row %s: %s, want %s", id, st.Status, want)
		}
	}
}
