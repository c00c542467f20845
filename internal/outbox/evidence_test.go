package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

func receipts(t *testing.T, pool *pgxpool.Pool, rs ...outbox.Receipt) []outbox.ReceiptResult {
	t.Helper()
	var out []outbox.ReceiptResult
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		out, err = outbox.ApplyReceipts(context.Background(), tx, rs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Receipts move a row forward only: early (the row still sending), twice,
// out of order, for an unknown row, for a dead one (which the provider's
// word moves: TestReceiptsOverruleDead), for no row at all.
func TestApplyReceipts(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	early := enqueue(t, pool, "+15551234567", "a")
	sent := enqueue(t, pool, "+15551234567", "b")
	unknown := enqueue(t, pool, "+15551234567", "c")
	dead := enqueue(t, pool, "+15551234567", "d")
	c := claimOne(t, pool, early, uuid.New())
	exec(t, pool, `UPDATE sms_outbox SET status = 'sent', provider_ref = 'msg_b' WHERE id = $1`, sent)
	exec(t, pool, `UPDATE sms_outbox SET status = 'unknown', end_reason = 'ambiguous' WHERE id = $1`, unknown)
	// Dead after its attempt: a receipt may only come for a row some
	// provider was asked to send (TestReceiptsApplyOnlyToTheirProvidersRows).
	exec(t, pool, `UPDATE sms_outbox SET status = 'dead', end_reason = 'permanent', attempt_count = 1 WHERE id = $1`, dead)
	missing := uuid.New()
	at := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)

	res := receipts(t, pool,
		outbox.Receipt{ID: early, Status: outbox.StatusDelivered, ProviderRef: "msg_a", At: at, Source: "generic"},
		outbox.Receipt{ID: sent, Status: outbox.StatusUndelivered, Code: 30003, Source: "generic"},
		outbox.Receipt{ID: unknown, Status: outbox.StatusSent, ProviderRef: "msg_c", Source: "twilio"},
		outbox.Receipt{ID: dead, Status: outbox.StatusDelivered, Source: "generic"},
		outbox.Receipt{ID: missing, Status: outbox.StatusDelivered, Source: "generic"},
		// A second, contrary report of a row already in this batch: the first
		// is final, the second only recorded.
		outbox.Receipt{ID: early, Status: outbox.StatusUndelivered, Source: "generic"},
	)
	want := []outbox.ReceiptResult{
		{Found: true, Prev: outbox.StatusSending, Applied: true},
		{Found: true, Prev: outbox.StatusSent, Applied: true},
		{Found: true, Prev: outbox.StatusUnknown, Applied: true},
		{Found: true, Prev: outbox.StatusDead, Applied: true},
		{},
		{Found: true, Prev: outbox.StatusDelivered},
	}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("receipt %d: %+v, want %+v", i, res[i], want[i])
		}
	}
	if !res[2].SettledUnknown() || !res[3].Contradicted() {
		t.Errorf("settled %v, contradicted %v", res[2].SettledUnknown(), res[3].Contradicted())
	}
	for id, w := range map[uuid.UUID]outbox.State{early: outbox.StatusDelivered, sent: outbox.StatusUndelivered, unknown: outbox.StatusSent, dead: outbox.StatusDelivered} {
		if st := status(t, pool, id); st.Status != w {
			t.Errorf("row %s is %s, want %s", id, st.Status, w)
		}
	}
	// The sender's own answer, late: it changes nothing of a delivered row.
	if w := write(t, pool, false, outbox.Result{ID: early, Status: outbox.StatusSent, ProviderRef: "msg_a"}); len(w) != 0 {
		t.Fatal("a late sent write overwrote delivered")
	}
	if w := write(t, pool, false, outbox.Result{ID: early, Status: outbox.StatusQueued, Error: "late retry", Token: c.Token}); len(w) != 0 {
		t.Fatal("a late retry write overwrote delivered")
	}
	// The same receipt again: nothing moves, and it is recorded once.
	if res := receipts(t, pool, outbox.Receipt{ID: sent, Status: outbox.StatusUndelivered, Code: 30003, Source: "generic"}); res[0].Applied || !res[0].Found {
		t.Fatal("a repeated receipt moved the row")
	}
	if ev, err := outbox.EvidenceOf(ctx, pool, sent); err != nil || len(ev) != 1 || ev[0].Code != 30003 {
		t.Fatalf("evidence of a repeated receipt = %+v, %v; want it once", ev, err)
	}
	ev, err := outbox.EvidenceOf(ctx, pool, early)
	if err != nil || len(ev) != 2 || ev[0].Result != "delivered" || !ev[0].ReportedAt.Equal(at) || ev[1].Result != "undelivered" {
		t.Fatalf("evidence = %+v, %v", ev, err)
	}
	if st := status(t, pool, unknown); st.ProviderRef != "msg_c" {
		t.Errorf("the receipt's provider id was not kept: %q", st.ProviderRef)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sms_evidence WHERE outbox_id = $1`, missing).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a receipt for no row was recorded (%d, %v)", n, err)
	}
}

// A receipt for a dead row contradicts it: dead promised the provider never
// took the message, and the provider's signed word says it did. The row
// follows the receipt (delivered, undelivered, or sent on a report of
// acceptance, with the provider's id), loses its dead-letter reason and
// says in its last error what happened; its letter's sequence and its
// attempts stay. A later receipt moves it on as for any row, and the same
// receipt again changes nothing.
func TestReceiptsOverruleDead(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	kill := func() uuid.UUID {
		id := enqueue(t, pool, "+15551234567", "a")
		p := &play{t: t, pool: pool, id: id}
		p.claim()
		p.permanent()
		exec(t, pool, `UPDATE sms_outbox SET letter_seq = 7 WHERE id = $1`, id)
		return id
	}
	delivered, undelivered, accepted, later := kill(), kill(), kill(), kill()
	res := receipts(t, pool,
		outbox.Receipt{ID: delivered, Status: outbox.StatusDelivered, ProviderRef: "msg_d", Source: "generic"},
		outbox.Receipt{ID: undelivered, Status: outbox.StatusUndelivered, Code: 30003, Source: "twilio"},
		outbox.Receipt{ID: accepted, Status: outbox.StatusSent, ProviderRef: "msg_a", Source: "generic"},
		outbox.Receipt{ID: later, Status: outbox.StatusSent, Source: "generic"},
	)
	for i, r := range res {
		if !r.Contradicted() || !r.Applied {
			t.Errorf("receipt %d: %+v, want a contradiction that moved the row", i, r)
		}
	}
	res = receipts(t, pool,
		outbox.Receipt{ID: later, Status: outbox.StatusDelivered, ProviderRef: "msg_l", Source: "generic"},
		outbox.Receipt{ID: delivered, Status: outbox.StatusDelivered, ProviderRef: "msg_d", Source: "generic"},
	)
	if want := (outbox.ReceiptResult{Found: true, Prev: outbox.StatusSent, Applied: true}); res[0] != want {
		t.Errorf("a delivery report after the acceptance: %+v, want %+v", res[0], want)
	}
	if want := (outbox.ReceiptResult{Found: true, Prev: outbox.StatusDelivered}); res[1] != want {
		t.Errorf("the same receipt again: %+v, want %+v", res[1], want)
	}
	for id, want := range map[uuid.UUID]struct {
		status outbox.State
		ref    string
		note   string
	}{
		delivered:   {outbox.StatusDelivered, "msg_d", "was dead, then a generic receipt reported the message delivered: the provider had it"},
		undelivered: {outbox.StatusUndelivered, "", "was dead, then a twilio receipt reported the message undelivered: the provider had it"},
		accepted:    {outbox.StatusSent, "msg_a", "was dead, then a generic receipt reported the message accepted: the provider had it"},
		later:       {outbox.StatusDelivered, "msg_l", "was dead, then a generic receipt reported the message accepted: the provider had it"},
	} {
		r, err := outbox.GetRow(ctx, pool, id)
		if err != nil {
			t.Fatal(err)
		}
		var sentAt *time.Time
		if err := pool.QueryRow(ctx, `SELECT sent_at FROM sms_outbox WHERE id = $1`, id).Scan(&sentAt); err != nil {
			t.Fatal(err)
		}
		letter := int64(-1)
		if r.LetterSeq != nil {
			letter = *r.LetterSeq
		}
		if r.Status != want.status || r.ProviderRef != want.ref || r.EndReason != "" || r.LastError != want.note || letter != 7 || sentAt == nil {
			t.Errorf("row %s: status %s, ref %q, end reason %q, last error %q, letter %d, sent_at %v; want %s, %q, no reason, %q, letter 7, sent_at set",
				id, r.Status, r.ProviderRef, r.EndReason, r.LastError, letter, sentAt, want.status, want.ref, want.note)
		}
		// The attempt that failed stays the row's only one.
		if atts, err := outbox.Attempts(ctx, pool, id); err != nil || len(atts) != 1 || atts[0].Outcome != "permanent" {
			t.Errorf("attempts of %s: %+v, %v", id, atts, err)
		}
	}
}

// A lookup's results: a failed one keeps the lookup pending and counts
// against the budget without spending an attempt (twice applied, counted
// once); one that found nothing clears the maybe-accepted mark, so that a
// row whose budget is spent ends dead; one that found the message settles
// the row with its id. Each is recorded as evidence once.
func TestLookupResults(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	row := func(attempts int) uuid.UUID {
		id := enqueue(t, pool, "+15551234567", "a")
		exec(t, pool, `UPDATE sms_outbox SET maybe_accepted = true, lookup_pending = true, attempt_count = $2 WHERE id = $1`, id, attempts)
		return id
	}
	failing, none, found := row(2), row(8), row(3)
	at := time.Now().UTC().Truncate(time.Microsecond)

	c := claimOne(t, pool, failing, uuid.New())
	if !c.LookupPending || c.Attempt != 3 {
		t.Fatalf("claim = %+v, want the lookup pending on attempt 3", c)
	}
	fail := outbox.Result{ID: failing, Status: outbox.StatusQueued, Error: "lookup failed", Token: c.Token, MaybeAccepted: true,
		Refund: true, LookupPending: true, LookupFailed: true, RetryIn: time.Second,
		Lookup: &outbox.Evidence{Result: "failed", Detail: "lookup failed: http 500", ReceivedAt: at, Source: "sender"}}
	write(t, pool, false, fail)
	write(t, pool, true, fail) // an answer lost after the commit: written again
	var pending bool
	var lookups, attempts int
	if err := pool.QueryRow(ctx, `SELECT lookup_pending, lookups, attempt_count FROM sms_outbox WHERE id = $1`, failing).Scan(&pending, &lookups, &attempts); err != nil {
		t.Fatal(err)
	}
	if !pending || lookups != 1 || attempts != 2 {
		t.Errorf("after a failed lookup: pending %v, lookups %d, attempts %d; want true, 1, 2", pending, lookups, attempts)
	}
	if ev, err := outbox.EvidenceOf(ctx, pool, failing); err != nil || len(ev) != 1 || ev[0].Kind != "lookup" || ev[0].Result != "failed" {
		t.Errorf("evidence = %+v, %v; want the failed lookup once", ev, err)
	}

	c = claimOne(t, pool, none, uuid.New())
	w := write(t, pool, false, outbox.Result{ID: none, Status: outbox.StatusDead, Reason: "max_attempts", Error: "attempts exhausted",
		Token: c.Token, NotAccepted: true, Lookup: &outbox.Evidence{Result: "none", ReceivedAt: at, Source: "sender"}})
	if st := status(t, pool, none); st.Status != outbox.StatusDead || w[none].Reason != "max_attempts" {
		t.Errorf("budget spent and the provider has nothing: %s (%q), want dead, max_attempts", st.Status, w[none].Reason)
	}

	c = claimOne(t, pool, found, uuid.New())
	write(t, pool, false, outbox.Result{ID: found, Status: outbox.StatusDelivered, ProviderRef: "msg_9", Token: c.Token, Refund: true,
		Lookup: &outbox.Evidence{Result: "found", ProviderRef: "msg_9", ReceivedAt: at, Source: "sender"}})
	st := status(t, pool, found)
	if err := pool.QueryRow(ctx, `SELECT lookup_pending, attempt_count FROM sms_outbox WHERE id = $1`, found).Scan(&pending, &attempts); err != nil {
		t.Fatal(err)
	}
	if st.Status != outbox.StatusDelivered || st.ProviderRef != "msg_9" || pending || attempts != 3 {
		t.Errorf("found: %s %q, pending %v, attempts %d; want delivered msg_9, false, 3", st.Status, st.ProviderRef, pending, attempts)
	}
}
