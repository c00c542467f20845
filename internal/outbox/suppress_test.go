package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// statusOf reads a row's status, attempts and last error.
func statusOf(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) (outbox.State, int, string) {
	t.Helper()
	var st outbox.State
	var n int
	var e string
	if err := pool.QueryRow(context.Background(), `SELECT status, attempt_count, coalesce(last_error, '') FROM sms_outbox WHERE id = $1`, id).
		Scan(&st, &n, &e); err != nil {
		t.Fatal(err)
	}
	return st, n, e
}

// refused asserts err is the trigger's check_violation.
func refused(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Errorf("%s: %v; want it refused (check_violation)", what, err)
	}
}

// The senders' claim ends a pending or queued row to a number on the
// list suppressed, in its own statement, with no attempt spent and the
// entry's source in last_error; a row an earlier attempt may have reached
// is claimed (to be settled by evidence, never called) with the entry's
// source; a row to another number is claimed as before.
func TestClaimEndsASuppressedNumbersRows(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	const stopped, other = "+15550000001", "+15550000002"
	pending := enqueue(t, owner, stopped, "a")
	queued := enqueue(t, owner, stopped, "b")
	marked := enqueue(t, owner, stopped, "c")
	free := enqueue(t, owner, other, "d")
	exec(t, owner, `UPDATE sms_outbox SET status = 'queued', next_attempt_at = now() + interval '1 hour' WHERE id = $1`, queued)
	exec(t, owner, `UPDATE sms_outbox SET status = 'queued', maybe_accepted = true, lookup_pending = true, attempt_count = 1 WHERE id = $1`, marked)

	receiver := rolePool(t, url, "sendonce_receiver")
	if res, err := outbox.ApplyInbound(ctx, receiver, outbox.Inbound{Number: stopped, Provider: "twilio", Keyword: "stop"}); err != nil || res != outbox.InboundSuppressed {
		t.Fatalf("STOP: %q, %v", res, err)
	}

	sender := rolePool(t, url, "sendonce_sender")
	claims, err := outbox.ClaimForSend(ctx, sender, []uuid.UUID{pending, queued, marked, free}, nil, 25*time.Second, uuid.New())
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]outbox.Claim{}
	for _, c := range claims {
		got[c.ID] = c
	}
	for _, id := range []uuid.UUID{pending, queued} {
		c := got[id]
		st, n, e := statusOf(t, owner, id)
		if c.Result != outbox.Suppressed || c.SuppressedBy != outbox.SourceInbound || st != outbox.StatusSuppressed || n != 0 ||
			!strings.Contains(e, "suppression list (source inbound twilio)") {
			t.Errorf("row %s: claim %v by %q, row %s, %d attempts, %q; want suppressed by the claim, no attempt, the source named",
				id, c.Result, c.SuppressedBy, st, n, e)
		}
	}
	if c := got[marked]; c.Result != outbox.Claimed || c.SuppressedBy != outbox.SourceInbound {
		t.Errorf("the row an attempt may have reached: %v by %q; want claimed, its number's entry named", c.Result, c.SuppressedBy)
	}
	if c := got[free]; c.Result != outbox.Claimed || c.SuppressedBy != "" {
		t.Errorf("the row to another number: %v by %q; want claimed", c.Result, c.SuppressedBy)
	}
	var finished *time.Time
	if err := owner.QueryRow(ctx, `SELECT finished_at FROM sms_outbox WHERE id = $1`, pending).Scan(&finished); err != nil || finished == nil {
		t.Errorf("a suppressed row has no finish time (%v): retention would keep it", err)
	}
}

// A stolen sender login, writing its own SQL, cannot claim a row whose
// number is on the list, nor suppress a row whose number is not on it;
// the sender's own moves into suppressed go through.
func TestASenderLoginCannotClaimASuppressedNumber(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	const stopped, other = "+15550000011", "+15550000012"
	listed := enqueue(t, owner, stopped, "a")
	queued := enqueue(t, owner, stopped, "b")
	exec(t, owner, `UPDATE sms_outbox SET status = 'queued' WHERE id = $1`, queued)
	unlisted := enqueue(t, owner, other, "c")
	if _, err := outbox.SuppressNumbers(ctx, rolePool(t, url, "sendonce_relay"), []string{stopped}, outbox.SourceOperator, "complaint", "alice"); err != nil {
		t.Fatal(err)
	}
	sender := rolePool(t, url, "sendonce_sender")
	for _, id := range []uuid.UUID{listed, queued} {
		// Skipped by the trigger: no error, no row moved.
		tag, err := sender.Exec(ctx, `UPDATE sms_outbox SET status = 'sending', attempt_count = attempt_count + 1, claim_id = gen_random_uuid(),
			lease_until = now() + interval '1 minute' WHERE id = $1`, id)
		if err != nil || tag.RowsAffected() != 0 {
			t.Errorf("a sender's own claim of a suppressed number's row: %d moved, %v; want none", tag.RowsAffected(), err)
		}
		if st, n, _ := statusOf(t, owner, id); st == outbox.StatusSending || n != 0 {
			t.Errorf("row %s is %s with %d attempts after the refused claim", id, st, n)
		}
	}
	_, err := sender.Exec(ctx, `UPDATE sms_outbox SET status = 'suppressed' WHERE id = $1`, unlisted)
	refused(t, err, "a sender's suppression of a number not on the list")
	// Nor can the sender write the list, or read what it may not.
	if _, err := sender.Exec(ctx, `DELETE FROM sms_suppressions`); err == nil {
		t.Error("the sender's role deleted the suppression list")
	}
	if _, err := sender.Exec(ctx, `INSERT INTO sms_suppressions (number, source) VALUES ($1, 'operator')`, other); err == nil {
		t.Error("the sender's role wrote the suppression list")
	}
	// Its own move: a claim that finds the number listed ends the row.
	if _, err := sender.Exec(ctx, `UPDATE sms_outbox SET status = 'suppressed' WHERE id = $1`, listed); err != nil {
		t.Errorf("the sender's move pending -> suppressed of a listed number: %v", err)
	}
	// A row an attempt may have reached is never suppressed.
	exec(t, owner, `UPDATE sms_outbox SET status = 'sending', maybe_accepted = true WHERE id = $1`, queued)
	_, err = sender.Exec(ctx, `UPDATE sms_outbox SET status = 'suppressed' WHERE id = $1`, queued)
	refused(t, err, "suppressing a row an attempt may have reached")
}

// The application adds a number (never removes one); the receiver's STOP
// adds and its START lifts what the recipient's own acts added, never an
// operator's entry; a removal needs who and why, and is recorded.
func TestSuppressionWritesByRole(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	app := rolePool(t, url, "sendonce_app")
	var added bool
	if err := app.QueryRow(ctx, `SELECT sendonce_suppress('+15550000021', 'unsubscribe link')`).Scan(&added); err != nil || !added {
		t.Fatalf("the application's sendonce_suppress: %v, %v", added, err)
	}
	if err := app.QueryRow(ctx, `SELECT sendonce_suppress('+15550000021', 'again')`).Scan(&added); err != nil || added {
		t.Errorf("a second sendonce_suppress of the same number: %v, %v; want false", added, err)
	}
	if _, err := app.Exec(ctx, `SELECT sendonce_suppress('12345', 'x')`); err == nil || strings.Contains(err.Error(), "12345") {
		t.Errorf("a bad number: %v; want refused, without the value", err)
	}
	if _, err := app.Exec(ctx, `DELETE FROM sms_suppressions`); err == nil {
		t.Error("the application deleted the list")
	}
	if _, err := app.Exec(ctx, `SELECT sendonce_suppress_remove('+15550000021', 'app', 'x')`); err == nil {
		t.Error("the application removed a number")
	}

	receiver := rolePool(t, url, "sendonce_receiver")
	relay := rolePool(t, url, "sendonce_relay")
	inbound := func(number, kw string, lift bool) string {
		t.Helper()
		res, err := outbox.ApplyInbound(ctx, receiver, outbox.Inbound{Number: number, Provider: "vonage", Keyword: kw, Lift: lift})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if got := inbound("+15550000021", "start", true); got != outbox.InboundLifted {
		t.Errorf("START of the app's entry: %s; want lifted (the recipient's own act)", got)
	}
	if got := inbound("+15550000022", "STOP", false); got != outbox.InboundSuppressed {
		t.Errorf("STOP: %s", got)
	}
	if got := inbound("+15550000022", "STOP", false); got != outbox.InboundUnchanged {
		t.Errorf("STOP again: %s", got)
	}
	if _, err := outbox.SuppressNumbers(ctx, relay, []string{"+15550000023"}, outbox.SourceOperator, "legal hold 2024-001234", "bob"); err != nil {
		t.Fatal(err)
	}
	if got := inbound("+15550000023", "YES", true); got != outbox.InboundKept {
		t.Errorf("START of an operator's entry: %s; want kept", got)
	}
	if got := inbound("+15550000024", "START", true); got != outbox.InboundUnchanged {
		t.Errorf("START of a number not on the list: %s", got)
	}
	if _, err := outbox.Unsuppress(ctx, relay, "+15550000023", "bob", ""); err == nil {
		t.Error("a removal without a reason went through")
	}
	if ok, err := outbox.Unsuppress(ctx, relay, "+15550000023", "bob", "cleared by legal"); err != nil || !ok {
		t.Fatalf("removal: %v, %v", ok, err)
	}
	e, removals, err := outbox.CheckSuppression(ctx, relay, "+15550000023")
	if err != nil || e != nil || len(removals) != 1 {
		t.Fatalf("check after removal: %v, %d removals, %v", e, len(removals), err)
	}
	r := removals[0]
	if r.By != "bob" || r.Via != "operator" || r.Reason != "cleared by legal" || r.Added.Source != outbox.SourceOperator ||
		r.Added.Reason != "legal hold #" || r.Added.By != "bob" {
		t.Errorf("removal recorded as %+v; want by bob, why, and the entry (its digit runs masked)", r)
	}
	e, _, err = outbox.CheckSuppression(ctx, relay, "+15550000022")
	if err != nil || e == nil || e.Source != outbox.SourceInbound || e.Provider != "vonage" || e.Reason != "STOP" || e.NumberMasked != "+1********22" {
		t.Errorf("check of a STOP's entry: %+v, %v", e, err)
	}
	// The relay reads the list masked, never its numbers.
	if _, err := relay.Exec(ctx, `SELECT number FROM sms_suppressions`); err == nil {
		t.Error("the relay's role read the list's numbers")
	}
	list, next, err := outbox.Suppressions(ctx, relay, 0, 10)
	if err != nil || len(list) != 1 || next != 0 || strings.Contains(list[0].NumberMasked, "0022") {
		t.Errorf("list: %+v, next %d, %v", list, next, err)
	}
	counts, capped, err := outbox.CountSuppressions(ctx, relay, 1000)
	if err != nil || capped || counts[outbox.SourceInbound] != 1 || counts[outbox.SourceOperator] != 0 {
		t.Errorf("counts: %v (capped %v), %v", counts, capped, err)
	}
	_ = owner
}

// A provider's opted-out refusal, written with the attempt's outcome,
// puts the row's number on the list and ends the row suppressed in one
// transaction; the next row to that number is suppressed by its claim.
func TestARefusalSuppressesTheNumber(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	const number = "+15550000031"
	first := enqueue(t, owner, number, "a")
	second := enqueue(t, owner, number, "b")
	sender := rolePool(t, url, "sendonce_sender")
	token := uuid.New()
	claims, err := outbox.ClaimForSend(ctx, sender, []uuid.UUID{first}, nil, 25*time.Second, token)
	if err != nil || claims[0].Result != outbox.Claimed {
		t.Fatalf("claim: %v, %v", claims, err)
	}
	err = pgx.BeginFunc(ctx, sender, func(tx pgx.Tx) error {
		_, err := outbox.ApplyResults(ctx, tx, []outbox.Result{{
			ID: first, Status: outbox.StatusSuppressed, Token: token, Refund: false, Attempt: 1, Error: "http 400, provider code 21610: opted out",
			Provider: "twilio", Suppress: &outbox.Suppression{Source: outbox.SourceRefusal, Provider: "twilio", Reason: "code 21610"},
		}}, nil, false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, _, _ := statusOf(t, owner, first); st != outbox.StatusSuppressed {
		t.Errorf("the refused row is %s, want suppressed", st)
	}
	claims, err = outbox.ClaimForSend(ctx, sender, []uuid.UUID{second}, nil, 25*time.Second, uuid.New())
	if err != nil || claims[0].Result != outbox.Suppressed || claims[0].SuppressedBy != outbox.SourceRefusal {
		t.Errorf("the next row's claim: %+v, %v; want suppressed by the refusal", claims, err)
	}
	e, err := outbox.SuppressionOf(ctx, rolePool(t, url, "sendonce_relay"), second)
	if err != nil || e == nil || !strings.HasPrefix(e.Describe(), "refusal twilio code 21610, since ") {
		t.Errorf("the row's suppression: %+v, %v", e, err)
	}
}

// A row the sender decided to end suppressed without a call (its claim
// found the number listed) whose number an operator removed before the
// write is put back, queued with its attempt given back, for the
// reconciler to publish: never suppressed off the list, never stuck.
func TestARowWhoseNumberLeftTheListIsPutBack(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	id := enqueue(t, owner, "+15550000041", "a")
	sender := rolePool(t, url, "sendonce_sender")
	token := uuid.New()
	if claims, err := outbox.ClaimForSend(ctx, sender, []uuid.UUID{id}, nil, 25*time.Second, token); err != nil || claims[0].Result != outbox.Claimed {
		t.Fatalf("claim: %+v, %v", claims, err)
	}
	var written map[uuid.UUID]outbox.Written
	err := pgx.BeginFunc(ctx, sender, func(tx pgx.Tx) error {
		var err error
		written, err = outbox.ApplyResults(ctx, tx, []outbox.Result{{ID: id, Status: outbox.StatusSuppressed, Token: token, Refund: true, Attempt: 1,
			Error: "suppressed before any provider call"}}, nil, false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	st, n, e := statusOf(t, owner, id)
	if _, ok := written[id]; !ok || st != outbox.StatusQueued || n != 0 || !strings.Contains(e, "left the suppression list") {
		t.Errorf("row: written %v, %s, %d attempts, %q; want put back queued, its attempt given back", written, st, n, e)
	}
}
