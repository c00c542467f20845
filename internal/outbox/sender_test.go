package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	app "github.com/sendonce/sendonce/outbox"
)

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

func claimOne(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, token uuid.UUID) outbox.Claim {
	t.Helper()
	cs, err := outbox.ClaimForSend(context.Background(), pool, []uuid.UUID{id}, nil, time.Minute, token)
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim %s = %+v, %v", id, cs, err)
	}
	return cs[0]
}

func write(t *testing.T, pool *pgxpool.Pool, again bool, rs ...outbox.Result) map[uuid.UUID]outbox.Written {
	t.Helper()
	var written map[uuid.UUID]outbox.Written
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		written, err = outbox.ApplyResults(context.Background(), tx, rs, nil, again)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return written
}

func status(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) app.MessageStatus {
	t.Helper()
	st, err := app.Status(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestClaimForSend(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	// Long, so that the live row is still leased however slow the machine;
	// the stale one ran out an hour ago.
	lease := time.Minute
	queued := enqueue(t, pool, "+15551234567", "a")
	pending := enqueue(t, pool, "+15551234568", "b")
	sent := enqueue(t, pool, "+15551234569", "c")
	stale := enqueue(t, pool, "+15551234570", "d")
	live := enqueue(t, pool, "+15551234571", "e")
	waiting := enqueue(t, pool, "+15551234572", "f")
	legacy := enqueue(t, pool, "+15551234573", "g")
	missing := uuid.New()
	other := uuid.New()
	exec(t, pool, `UPDATE sms_outbox SET status='queued' WHERE id = $1`, queued)
	exec(t, pool, `UPDATE sms_outbox SET status='sent', provider_ref='msg_1' WHERE id = $1`, sent)
	exec(t, pool, `UPDATE sms_outbox SET status='sending', attempt_count=1, claim_id=$2, lease_until=now()-interval '1 hour' WHERE id = $1`, stale, other)
	exec(t, pool, `UPDATE sms_outbox SET status='sending', attempt_count=1, claim_id=$2, lease_until=now()+interval '1 minute' WHERE id = $1`, live, other)
	exec(t, pool, `UPDATE sms_outbox SET status='queued', attempt_count=1, next_attempt_at=now()+interval '1 minute' WHERE id = $1`, waiting)
	// A row claimed before leases were stamped in the row: its lease is
	// its last touch plus the claimant's lease.
	exec(t, pool, `UPDATE sms_outbox SET status='sending', attempt_count=1, updated_at=now()-interval '1 hour' WHERE id = $1`, legacy)

	token := uuid.New()
	claims, err := outbox.ClaimForSend(ctx, pool, []uuid.UUID{queued, pending, sent, stale, live, waiting, legacy, missing, queued}, nil, lease, token)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]outbox.Claim{}
	for _, c := range claims {
		got[c.ID] = c
	}
	if len(claims) != 8 {
		t.Fatalf("%d claims, want 8 (one per distinct id)", len(claims))
	}
	want := map[uuid.UUID]outbox.ClaimResult{
		queued: outbox.Claimed, pending: outbox.Claimed, sent: outbox.AlreadyTerminal, stale: outbox.ClaimedStale,
		live: outbox.Leased, waiting: outbox.Leased, legacy: outbox.ClaimedStale, missing: outbox.NotFound,
	}
	for id, w := range want {
		if got[id].Result != w {
			t.Errorf("row %s: result %d, want %d", id, got[id].Result, w)
		}
	}
	if c := got[queued]; c.To != "+15551234567" || c.Body != "a" || c.Attempt != 1 || c.MaxAttempts != 8 || c.Token != token {
		t.Errorf("claimed row = %+v", c)
	}
	if c := got[stale]; c.Attempt != 2 || !c.MaybeAccepted || c.LeaseEnded < 59*time.Minute || c.LeaseEnded > 61*time.Minute {
		t.Errorf("stale row = %+v, want attempt 2, maybe accepted, its lease over an hour ago", c)
	}
	if c := got[pending]; c.Age < 0 || c.Age > time.Minute || c.DueIn > 0 || c.LeaseEnded != 0 {
		t.Errorf("fresh row = %+v, want a young age, due already, no lease ended", c)
	}
	if c := got[live]; c.LeaseLeft <= 0 || c.LeaseLeft > lease {
		t.Errorf("live lease left = %s", c.LeaseLeft)
	}
	if c := got[waiting]; c.LeaseLeft < 50*time.Second {
		t.Errorf("waiting row: wait %s, want about a minute", c.LeaseLeft)
	}
	// A second claim of the same rows, under another token, finds them
	// leased: a concurrent delivery never calls the provider.
	again, err := outbox.ClaimForSend(ctx, pool, []uuid.UUID{queued}, nil, lease, uuid.New())
	if err != nil || len(again) != 1 || again[0].Result != outbox.Leased {
		t.Fatalf("second claim = %+v, %v; want Leased", again, err)
	}
	var leaseUntil, updated time.Time
	if err := pool.QueryRow(ctx, `SELECT lease_until, updated_at FROM sms_outbox WHERE id = $1`, queued).Scan(&leaseUntil, &updated); err != nil {
		t.Fatal(err)
	}
	if d := leaseUntil.Sub(updated); d < lease-time.Second || d > lease+time.Second {
		t.Errorf("lease_until - updated_at = %s, want the lease %s", d, lease)
	}
}

// A claim whose answer was lost is run again with the same token: it finds
// the rows it took as its own (Claimed, the same attempt), even after its
// lease ran out, and never as "a sender died mid-call".
func TestClaimAgainWithTheSameToken(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	id := enqueue(t, pool, "+15551234567", "a")
	token := uuid.New()
	first := claimOne(t, pool, id, token)
	if first.Result != outbox.Claimed || first.Attempt != 1 {
		t.Fatalf("first claim = %+v", first)
	}
	// The database outage outlived the lease.
	exec(t, pool, `UPDATE sms_outbox SET lease_until = now() - interval '1 minute' WHERE id = $1`, id)
	again := claimOne(t, pool, id, token)
	if again.Result != outbox.Claimed || again.Attempt != 1 || again.MaybeAccepted {
		t.Fatalf("claim run again = %+v; want Claimed, attempt 1, not maybe accepted", again)
	}
	var left time.Duration
	if err := pool.QueryRow(context.Background(), `SELECT extract(epoch FROM lease_until - now()) * interval '1 second' FROM sms_outbox WHERE id = $1`, id).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left < 50*time.Second {
		t.Fatalf("the claim run again left a lease of %s, want it renewed", left)
	}
	// Another claimant, meanwhile, still sees a live lease.
	if c := claimOne(t, pool, id, uuid.New()); c.Result != outbox.Leased {
		t.Fatalf("other claim = %+v, want Leased", c)
	}
}

func TestApplyResultsGuards(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	a := enqueue(t, pool, "+15551234567", "a")
	b := enqueue(t, pool, "+15551234567", "b")
	c := enqueue(t, pool, "+15551234567", "c")
	ca, cb, cc := claimOne(t, pool, a, uuid.New()), claimOne(t, pool, b, uuid.New()), claimOne(t, pool, c, uuid.New())
	w := write(t, pool, false,
		outbox.Result{ID: a, Status: outbox.StatusSent, ProviderRef: "msg_a"},
		outbox.Result{ID: b, Status: outbox.StatusQueued, Error: "http 503", RetryIn: time.Second, Token: cb.Token},
		outbox.Result{ID: c, Status: outbox.StatusDead, Reason: "permanent", Error: "http 400\x00 with a NUL and \xff bad UTF-8", Token: cc.Token},
	)
	if len(w) != 3 {
		t.Fatalf("first write changed %d rows, want 3", len(w))
	}
	if w[c].Attempts != 1 || w[c].Gen != 0 {
		t.Fatalf("written = %+v", w[c])
	}
	// Late or duplicate outcomes never move a finished row.
	w = write(t, pool, false,
		outbox.Result{ID: a, Status: outbox.StatusDead, Reason: "permanent", Error: "late", Token: ca.Token},
		outbox.Result{ID: a, Status: outbox.StatusSent, ProviderRef: "msg_again"},
	)
	if len(w) != 0 {
		t.Fatalf("late writes changed %v, want nothing", w)
	}
	// The same result written twice (the first commit's answer was lost)
	// applies again to the row it moved, and changes nothing else.
	if w := write(t, pool, true, outbox.Result{ID: b, Status: outbox.StatusQueued, Error: "http 503", RetryIn: time.Second, Token: cb.Token}); len(w) != 1 {
		t.Fatalf("a retry written again did not apply")
	}
	// A write from an overtaken attempt changes nothing: b is claimed
	// again, and the first claim's late write must not move it.
	exec(t, pool, `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, b)
	cb2 := claimOne(t, pool, b, uuid.New())
	if cb2.Result != outbox.Claimed || cb2.Attempt != 2 {
		t.Fatalf("second claim of b = %+v", cb2)
	}
	if w := write(t, pool, false, outbox.Result{ID: b, Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "stale", Token: cb.Token}); len(w) != 0 {
		t.Fatalf("an unknown write from the first claim changed the second claim's row")
	}
	// A republication by the reconciler overlapping a slow attempt keeps
	// its claim: the attempt still owns the row and its write applies.
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error { return outbox.MarkRepublished(context.Background(), tx, b, 1, 42) }); err != nil {
		t.Fatal(err)
	}
	if w := write(t, pool, false, outbox.Result{ID: b, Status: outbox.StatusQueued, Error: "mine", RetryIn: time.Minute, Park: true, Token: cb2.Token}); len(w) != 1 || w[b].Gen != 1 {
		t.Fatalf("the owning attempt's write = %v; want applied, in the republication's generation (its letter's id)", w)
	}
	var seq *int64
	var wait float64
	if err := pool.QueryRow(context.Background(), `SELECT stream_seq, extract(epoch FROM next_attempt_at - now()) FROM sms_outbox WHERE id = $1`, b).Scan(&seq, &wait); err != nil {
		t.Fatal(err)
	}
	if seq != nil || wait < 50 || wait > 61 {
		t.Fatalf("parked retry: stream_seq %v, due in %.1fs; want NULL and about a minute from the database clock", seq, wait)
	}
	// A write from before a replay changes nothing either.
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := outbox.Replay(context.Background(), tx, []outbox.ReplayTarget{{ID: c}}, outbox.ReplayOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cc2 := claimOne(t, pool, c, uuid.New())
	if cc2.Attempt != 1 {
		t.Fatalf("claim after replay = %+v; want attempt 1", cc2)
	}
	if w := write(t, pool, false, outbox.Result{ID: c, Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "from before the replay", Token: cc.Token}); len(w) != 0 {
		t.Fatalf("a write from before the replay changed the replayed row")
	}
	if w := write(t, pool, false, outbox.Result{ID: c, Status: outbox.StatusDead, Reason: "permanent", Error: "http 400\x00 with a NUL and \xff bad UTF-8", Token: cc2.Token}); len(w) != 1 || w[c].Gen != 1 {
		t.Fatalf("the replayed row's own attempt's write = %v", w)
	}
	if st := status(t, pool, c); !utf8.ValidString(st.LastError) || strings.ContainsRune(st.LastError, 0) {
		t.Errorf("last_error %q was stored unclean", st.LastError)
	}
	for id, want := range map[uuid.UUID]outbox.State{a: outbox.StatusSent, b: outbox.StatusQueued, c: outbox.StatusDead} {
		if st := status(t, pool, id); st.Status != want {
			t.Errorf("row %s: %+v; want %s", id, st, want)
		}
	}
	if st := status(t, pool, a); st.ProviderRef != "msg_a" {
		t.Errorf("provider_ref = %q", st.ProviderRef)
	}
}

// The provider's answer is evidence: a sent write settles an unknown row
// (its attempt's answer came in after another claimant gave up on it), and
// clears its dead-letter reason.
func TestSentSettlesUnknown(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	id := enqueue(t, pool, "+15551234567", "a")
	c := claimOne(t, pool, id, uuid.New())
	if w := write(t, pool, false, outbox.Result{ID: id, Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "lost", Token: c.Token}); len(w) != 1 {
		t.Fatal("unknown not written")
	}
	if w := write(t, pool, false, outbox.Result{ID: id, Status: outbox.StatusSent, ProviderRef: "msg_late"}); len(w) != 1 {
		t.Fatal("sent did not settle unknown")
	}
	var reason *string
	if err := pool.QueryRow(context.Background(), `SELECT end_reason FROM sms_outbox WHERE id = $1`, id).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if st := status(t, pool, id); st.Status != outbox.StatusSent || st.ProviderRef != "msg_late" || reason != nil {
		t.Fatalf("row = %+v, end_reason %v", st, reason)
	}
	// So is an answer that contradicts dead: a later claim concluded that
	// nothing was sent (a lookup that came too early found nothing, the
	// budget spent), while this attempt's answer says the provider took it.
	dead := enqueue(t, pool, "+15551234568", "b")
	cd := claimOne(t, pool, dead, uuid.New())
	if w := write(t, pool, false, outbox.Result{ID: dead, Status: outbox.StatusDead, Reason: "max_attempts", Error: "spent", Token: cd.Token}); len(w) != 1 {
		t.Fatal("dead not written")
	}
	if w := write(t, pool, false, outbox.Result{ID: dead, Status: outbox.StatusSent, ProviderRef: "msg_took"}); len(w) != 1 {
		t.Fatal("the provider's answer did not overrule dead")
	}
	if st := status(t, pool, dead); st.Status != outbox.StatusSent || st.ProviderRef != "msg_took" {
		t.Fatalf("row = %+v, want sent", st)
	}
}

// A batch writing the same row twice (a late outcome of an overtaken
// attempt beside the current one) applies the current one.
func TestApplyResultsSameRowTwice(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	id := enqueue(t, pool, "+15551234567", "a")
	old := uuid.New()
	c := claimOne(t, pool, id, uuid.New())
	w := write(t, pool, false,
		outbox.Result{ID: id, Status: outbox.StatusDead, Reason: "permanent", Error: "overtaken", Token: old},
		outbox.Result{ID: id, Status: outbox.StatusQueued, Error: "http 503", RetryIn: time.Second, Token: c.Token},
	)
	if len(w) != 1 {
		t.Fatalf("written = %v", w)
	}
	if st := status(t, pool, id); st.Status != outbox.StatusQueued {
		t.Fatalf("row = %+v, want queued", st)
	}
}

// Status writes and claims of overlapping rows in opposite orders never
// deadlock: both lock their rows in id order.
func TestWritesAndClaimsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	const n = 40
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = enqueue(t, pool, "+15551234567", fmt.Sprint(i))
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for round := range 20 {
		reversed := make([]uuid.UUID, n)
		for i := range ids {
			reversed[i] = ids[n-1-i]
		}
		order := ids
		if round%2 == 1 {
			order = reversed
		}
		token := uuid.New()
		claims, err := outbox.ClaimForSend(ctx, pool, order, nil, time.Millisecond, token)
		if err != nil {
			t.Fatal(err)
		}
		_ = claims
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rs := make([]outbox.Result, 0, n)
				src := ids
				if w == 1 {
					src = reversed
				}
				for _, id := range src {
					rs = append(rs, outbox.Result{ID: id, Status: outbox.StatusQueued, Error: "x", Token: token})
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.ApplyResults(ctx, tx, rs, nil, false)
					return err
				})
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := outbox.ClaimForSend(ctx, pool, reversed, nil, time.Millisecond, uuid.New()); err != nil {
				errs <- err
			}
		}()
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		t.Errorf("concurrent write or claim: %v", err)
	}
}

// The attempts log does not get a record twice when a write is tried again
// after a commit whose answer was lost.
func TestAttemptsWrittenAgainAreNotDoubled(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	id := enqueue(t, pool, "+15551234567", "a")
	c := claimOne(t, pool, id, uuid.New())
	at := time.Now()
	rec := []outbox.Attempt{{OutboxID: id, Number: c.Attempt, StartedAt: at, Outcome: "sent", HTTPStatus: 201, Sender: "t"}}
	res := []outbox.Result{{ID: id, Status: outbox.StatusSent, ProviderRef: "msg"}}
	for _, again := range []bool{false, true} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.ApplyResults(ctx, tx, res, rec, again)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	atts, err := outbox.Attempts(ctx, pool, id)
	if err != nil || len(atts) != 1 {
		t.Fatalf("attempts = %+v, %v; want one", atts, err)
	}
}

// maybe_accepted is sticky: once an attempt may have reached the provider
// (a retry that says so, or a stale claim taking over an attempt that never
// reported back), every later claim sees it, whatever later attempts say.
func TestMaybeAcceptedIsSticky(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	lost := enqueue(t, pool, "+15551234567", "a")
	refused := enqueue(t, pool, "+15551234568", "b")
	stale := enqueue(t, pool, "+15551234569", "c")
	claim := func(id uuid.UUID) outbox.Claim {
		t.Helper()
		exec(t, pool, `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, id)
		c := claimOne(t, pool, id, uuid.New())
		if c.Result != outbox.Claimed && c.Result != outbox.ClaimedStale {
			t.Fatalf("claim %s = %+v", id, c)
		}
		return c
	}
	retry := func(c outbox.Claim, maybe bool) {
		t.Helper()
		w := write(t, pool, false, outbox.Result{ID: c.ID, Status: outbox.StatusQueued, Error: "x", Token: c.Token, MaybeAccepted: maybe})
		if _, ok := w[c.ID]; !ok {
			t.Fatalf("retry of %s not applied", c.ID)
		}
	}

	c := claim(lost)
	if c.MaybeAccepted {
		t.Fatal("a fresh row claims an earlier attempt may have been accepted")
	}
	retry(c, true) // the answer was lost
	if c = claim(lost); !c.MaybeAccepted {
		t.Fatal("the claim after a lost answer does not know it")
	}
	retry(c, false) // a 503: says nothing about the earlier attempt
	if c = claim(lost); !c.MaybeAccepted {
		t.Fatal("a later refusal cleared maybe_accepted")
	}

	c = claim(refused)
	retry(c, false)
	if c = claim(refused); c.MaybeAccepted {
		t.Fatal("maybe_accepted set by refusals only")
	}

	claim(stale)
	exec(t, pool, `UPDATE sms_outbox SET lease_until = now() - interval '1 hour' WHERE id = $1`, stale)
	if c = claim(stale); c.Result != outbox.ClaimedStale || !c.MaybeAccepted {
		t.Fatalf("stale claim = %+v, want ClaimedStale and MaybeAccepted", c)
	}
}

// A fenced write that applies to nothing still leaves its caution in the
// row: a failover lost the claim (the promoted database has the row queued
// or pending, as before the attempt), and the attempt's answer was lost at
// a provider without idempotency. The next claim must know that an attempt
// may have reached the provider, that a lookup comes first, and not before
// the settle time; a finished row is left alone.
func TestMissedWriteKeepsItsCaution(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	queued := enqueue(t, pool, "+15551234567", "a")
	pending := enqueue(t, pool, "+15551234568", "b")
	unknown := enqueue(t, pool, "+15551234569", "c")
	sent := enqueue(t, pool, "+15551234570", "d")
	var claims []outbox.Claim
	for _, id := range []uuid.UUID{queued, pending, unknown, sent} {
		claims = append(claims, claimOne(t, pool, id, uuid.New()))
	}
	// What the promoted standby holds: the claims never replicated.
	exec(t, pool, `UPDATE sms_outbox SET status = 'queued', claim_id = NULL, lease_until = NULL, attempt_count = 0 WHERE id = ANY($1)`,
		[]uuid.UUID{queued, unknown})
	exec(t, pool, `UPDATE sms_outbox SET status = 'pending', claim_id = NULL, lease_until = NULL, attempt_count = 0 WHERE id = $1`, pending)
	exec(t, pool, `UPDATE sms_outbox SET status = 'sent', claim_id = NULL WHERE id = $1`, sent)

	lookupLater := func(c outbox.Claim) outbox.Result {
		return outbox.Result{ID: c.ID, Status: outbox.StatusQueued, Error: "timeout; will be looked up", RetryIn: 10 * time.Second,
			Token: c.Token, MaybeAccepted: true, LookupPending: true, Attempt: c.Attempt, Gen: c.Gen}
	}
	w := write(t, pool, false, lookupLater(claims[0]), lookupLater(claims[1]),
		outbox.Result{ID: unknown, Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "timeout", Token: claims[2].Token, MaybeAccepted: true,
			Attempt: claims[2].Attempt, Gen: claims[2].Gen},
		lookupLater(claims[3]))
	if len(w) != 0 {
		t.Fatalf("fenced writes applied to rows their claims no longer hold: %v", w)
	}
	type row struct {
		status        string
		maybe, lookup bool
		dueIn         float64
	}
	read := func(id uuid.UUID) row {
		t.Helper()
		var r row
		if err := pool.QueryRow(context.Background(), `SELECT status, maybe_accepted, lookup_pending,
				extract(epoch FROM next_attempt_at - now()) FROM sms_outbox WHERE id = $1`, id).
			Scan(&r.status, &r.maybe, &r.lookup, &r.dueIn); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, id := range []uuid.UUID{queued, pending} {
		if r := read(id); r.status == "sending" || !r.maybe || !r.lookup || r.dueIn < 8 || r.dueIn > 11 {
			t.Errorf("row %s after its missed write: %+v; want maybe_accepted, lookup pending, due in about 10s", id, r)
		}
	}
	if r := read(unknown); !r.maybe || !r.lookup {
		t.Errorf("row after a missed unknown write: %+v; want maybe_accepted and its lookup pending (where none can be made, the claim ends it unknown)", r)
	}
	if r := read(sent); r.maybe || r.lookup || r.status != "sent" {
		t.Errorf("a finished row was marked: %+v", r)
	}
	// The attempts the lost claims counted are counted again: their calls
	// were made, and their records are in the attempts log.
	var counts []int
	rows, err := pool.Query(context.Background(), `SELECT attempt_count FROM sms_outbox WHERE id = ANY($1) ORDER BY id`, []uuid.UUID{queued, pending, unknown})
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int
		_ = rows.Scan(&n)
		counts = append(counts, n)
	}
	rows.Close()
	if len(counts) != 3 || counts[0] != 1 || counts[1] != 1 || counts[2] != 1 {
		t.Fatalf("attempt counts %v after the missed writes of attempt 1, want 1 each", counts)
	}
	// The redelivery's claim sees it; the queued row not before it is due.
	if c := claimOne(t, pool, queued, uuid.New()); c.Result != outbox.Leased {
		t.Errorf("claim of the marked queued row before its settle time = %+v; want Leased", c)
	}
	if c := claimOne(t, pool, unknown, uuid.New()); c.Result != outbox.Claimed || !c.MaybeAccepted || !c.LookupPending {
		t.Errorf("claim after the missed unknown write = %+v; want claimed with MaybeAccepted and LookupPending", c)
	}
}

// A sender holds the outcome of a row whose insert was lost with a
// failed-over primary: its status write, with the attempt's record and a
// lookup's evidence, commits for the rows that exist and keeps nothing of
// the one that is gone, rather than fail the batch forever on the foreign
// keys (which stalled every status write of the sender).
func TestOutcomesOfAVanishedRow(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	kept := enqueue(t, pool, "+15551234567", "a")
	gone := uuid.New()
	ck := claimOne(t, pool, kept, uuid.New())
	now := time.Now()
	rs := []outbox.Result{
		{ID: kept, Status: outbox.StatusQueued, Error: "timeout", RetryIn: time.Second, Token: ck.Token, MaybeAccepted: true, LookupPending: true},
		{ID: gone, Status: outbox.StatusQueued, Error: "timeout", RetryIn: time.Second, Token: uuid.New(), MaybeAccepted: true, LookupPending: true,
			Lookup: &outbox.Evidence{Kind: "lookup", Result: "none", ReceivedAt: now, Source: "sender"}},
	}
	as := []outbox.Attempt{
		{OutboxID: kept, Number: 1, StartedAt: now, Outcome: "ambiguous", Sender: "s"},
		{OutboxID: gone, Number: 1, StartedAt: now, Outcome: "ambiguous", Sender: "s"},
	}
	var written map[uuid.UUID]outbox.Written
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		written, err = outbox.ApplyResults(ctx, tx, rs, as, false)
		return err
	}); err != nil {
		t.Fatalf("the batch failed on the vanished row: %v", err)
	}
	if _, ok := written[kept]; !ok || len(written) != 1 {
		t.Fatalf("written = %v, want the existing row only", written)
	}
	var logged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sms_attempts WHERE outbox_id = $1`, kept).Scan(&logged); err != nil || logged != 1 {
		t.Fatalf("attempts of the existing row: %d, %v; want 1", logged, err)
	}
}

// A lookup's claim counts an attempt, which its result gives back; when a
// receipt finished the row meanwhile, the result applies to nothing, and
// the attempt is given back all the same, once, even when the write is run
// again after a lost answer.
func TestRefundOfAFinishedRow(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	id := enqueue(t, pool, "+15551234567", "a")
	c := claimOne(t, pool, id, uuid.New())
	exec(t, pool, `UPDATE sms_outbox SET status = 'delivered', provider_ref = 'msg_1' WHERE id = $1`, id)
	found := outbox.Result{ID: id, Status: outbox.StatusDelivered, ProviderRef: "msg_1", Token: c.Token, Refund: true}
	for _, again := range []bool{false, true} {
		if w := write(t, pool, again, found); len(w) != 0 {
			t.Fatalf("a write over a delivered row applied: %v", w)
		}
		if st := status(t, pool, id); st.Attempts != 0 {
			t.Fatalf("attempt_count %d after the write (again %v), want the lookup's claim given back once", st.Attempts, again)
		}
	}
}

// A receipt of acceptance that moves the row to sent before the lookup's
// result arrives: the lookup's delivered is written over sent, and its
// claim's attempt is given back with it, once, even when the write is run
// again after a lost answer.
func TestRefundOfARowAReceiptMovedOn(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	id := enqueue(t, pool, "+15551234567", "a")
	c := claimOne(t, pool, id, uuid.New())
	exec(t, pool, `UPDATE sms_outbox SET status = 'sent', provider_ref = 'msg_1', sent_at = now() WHERE id = $1`, id)
	found := outbox.Result{ID: id, Status: outbox.StatusDelivered, ProviderRef: "msg_1", Token: c.Token, Refund: true}
	if w := write(t, pool, false, found); len(w) != 1 {
		t.Fatalf("the lookup's delivered was not written over sent: %v", w)
	}
	for _, again := range []bool{false, true} {
		if again {
			write(t, pool, true, found)
		}
		if st := status(t, pool, id); st.Attempts != 0 || st.Status != outbox.StatusDelivered {
			t.Fatalf("status %s, attempt_count %d (again %v), want delivered with the lookup's claim given back once", st.Status, st.Attempts, again)
		}
	}
}

// Dead letters: a dead row has none recorded until MarkLettered, and the
// reconciler's search finds it meanwhile (once old enough); a replayed row
// (a new generation) is not marked by a letter of the old one.
func TestLettersRecordedInTheRow(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	id := enqueue(t, pool, "+15551234567", "a")
	c := claimOne(t, pool, id, uuid.New())
	write(t, pool, false, outbox.Result{ID: id, Status: outbox.StatusDead, Reason: "permanent", Error: "http 400", Token: c.Token})
	unlettered := func(olderThan time.Duration) []outbox.Unlettered {
		t.Helper()
		var out []outbox.Unlettered
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			out, err = outbox.ClaimUnlettered(ctx, tx, olderThan, 10)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := unlettered(time.Hour); len(got) != 0 {
		t.Fatalf("a fresh dead row is offered to the reconciler: %+v", got)
	}
	got := unlettered(-time.Second)
	if len(got) != 1 || got[0].ID != id || got[0].Reason != "permanent" || got[0].Status != outbox.StatusDead || got[0].Attempts != 1 {
		t.Fatalf("unlettered = %+v", got)
	}
	if err := outbox.MarkLettered(ctx, pool, []outbox.Lettered{{ID: id, Gen: 1, Seq: 7}}); err != nil {
		t.Fatal(err)
	}
	if got := unlettered(-time.Second); len(got) != 1 {
		t.Fatal("a letter of another generation marked the row")
	}
	if err := outbox.MarkLettered(ctx, pool, []outbox.Lettered{{ID: id, Gen: 0, Seq: 7}}); err != nil {
		t.Fatal(err)
	}
	if got := unlettered(-time.Second); len(got) != 0 {
		t.Fatalf("lettered row still offered: %+v", got)
	}
}

// A first attempt that was sent is not logged by the senders: Attempts
// describes it from the row (sent_at), after whatever the log holds (a 429
// before it), and never beside a logged record of that attempt.
func TestFirstSentAttemptComesFromTheRow(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	receipt := func(id uuid.UUID) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.ApplyReceipts(ctx, tx, []outbox.Receipt{{ID: id, Status: outbox.StatusDelivered, Source: "t"}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	write := func(rs []outbox.Result, as []outbox.Attempt) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.ApplyResults(ctx, tx, rs, as, false)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	sentAt := func(id uuid.UUID) *time.Time {
		t.Helper()
		var at *time.Time
		if err := pool.QueryRow(ctx, `SELECT sent_at FROM sms_outbox WHERE id = $1`, id).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	outcomes := func(id uuid.UUID) string {
		t.Helper()
		atts, err := outbox.Attempts(ctx, pool, id)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, a := range atts {
			s = append(s, fmt.Sprintf("%d:%s:%v", a.Number, a.Outcome, a.FromRow))
			if a.FromRow && !a.StartedAt.Equal(*sentAt(id)) {
				t.Errorf("%s: the row's attempt at %s, sent_at %s", id, a.StartedAt, *sentAt(id))
			}
		}
		return strings.Join(s, " ")
	}

	// Sent at once: no record, the row tells.
	once := enqueue(t, pool, "+15551234567", "a")
	c := claimOne(t, pool, once, uuid.New())
	if sentAt(once) != nil {
		t.Fatal("sent_at set before the provider took the message")
	}
	write([]outbox.Result{{ID: once, Status: outbox.StatusSent, ProviderRef: "m1", Token: c.Token}}, nil)
	first := sentAt(once)
	if first == nil {
		t.Fatal("sent_at not set by the sent write")
	}
	if got := outcomes(once); got != "1:sent:true" {
		t.Errorf("sent at once: %s", got)
	}
	// A receipt later keeps the first time.
	receipt(once)
	if at := sentAt(once); at == nil || !at.Equal(*first) {
		t.Errorf("sent_at after the receipt: %v, want %s", at, *first)
	}

	// A 429 first (refunded, logged), then sent on attempt 1.
	limited := enqueue(t, pool, "+15551234568", "b")
	c = claimOne(t, pool, limited, uuid.New())
	write([]outbox.Result{{ID: limited, Status: outbox.StatusQueued, Error: "429", Token: c.Token, Refund: true}},
		[]outbox.Attempt{{OutboxID: limited, Number: c.Attempt, StartedAt: time.Now(), Outcome: "rate_limited", HTTPStatus: 429}})
	exec(t, pool, `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, limited)
	c = claimOne(t, pool, limited, uuid.New())
	if c.Attempt != 1 {
		t.Fatalf("attempt after a 429: %d, want 1", c.Attempt)
	}
	write([]outbox.Result{{ID: limited, Status: outbox.StatusSent, ProviderRef: "m2", Token: c.Token}}, nil)
	if got := outcomes(limited); got != "1:rate_limited:false 1:sent:true" {
		t.Errorf("429 then sent: %s", got)
	}

	// A retry, then sent on attempt 2: both logged, nothing from the row.
	retried := enqueue(t, pool, "+15551234569", "c")
	c = claimOne(t, pool, retried, uuid.New())
	write([]outbox.Result{{ID: retried, Status: outbox.StatusQueued, Error: "503", Token: c.Token}},
		[]outbox.Attempt{{OutboxID: retried, Number: 1, StartedAt: time.Now(), Outcome: "retry", HTTPStatus: 503}})
	exec(t, pool, `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, retried)
	c = claimOne(t, pool, retried, uuid.New())
	write([]outbox.Result{{ID: retried, Status: outbox.StatusSent, ProviderRef: "m3", Token: c.Token}},
		[]outbox.Attempt{{OutboxID: retried, Number: 2, StartedAt: time.Now(), Outcome: "sent", HTTPStatus: 201}})
	if got := outcomes(retried); got != "1:retry:false 2:sent:false" {
		t.Errorf("retry then sent: %s", got)
	}

	// An ambiguous first attempt settled by a receipt: its record stays
	// the only one of attempt 1.
	unanswered := enqueue(t, pool, "+15551234570", "d")
	c = claimOne(t, pool, unanswered, uuid.New())
	write([]outbox.Result{{ID: unanswered, Status: outbox.StatusQueued, Error: "timeout", Token: c.Token, MaybeAccepted: true}},
		[]outbox.Attempt{{OutboxID: unanswered, Number: 1, StartedAt: time.Now(), Outcome: "retry"}})
	receipt(unanswered)
	if sentAt(unanswered) == nil {
		t.Error("sent_at not set by a receipt that came first")
	}
	if got := outcomes(unanswered); got != "1:retry:false" {
		t.Errorf("settled by a receipt: %s", got)
	}

	// A replayed row (generation 1): its attempt 1 before the replay is in
	// the log, so the senders log every attempt after it, and nothing is
	// described from the row.
	replayed := enqueue(t, pool, "+15551234572", "f")
	c = claimOne(t, pool, replayed, uuid.New())
	write([]outbox.Result{{ID: replayed, Status: outbox.StatusDead, Reason: "permanent", Error: "400", Token: c.Token}},
		[]outbox.Attempt{{OutboxID: replayed, Number: 1, StartedAt: time.Now(), Outcome: "permanent", HTTPStatus: 400}})
	exec(t, pool, `UPDATE sms_outbox SET status = 'pending', publish_gen = 1, attempt_count = 0, end_reason = NULL WHERE id = $1`, replayed)
	c = claimOne(t, pool, replayed, uuid.New())
	if c.Attempt != 1 || c.Gen != 1 {
		t.Fatalf("replayed claim: attempt %d gen %d", c.Attempt, c.Gen)
	}
	write([]outbox.Result{{ID: replayed, Status: outbox.StatusSent, ProviderRef: "m6", Token: c.Token}},
		[]outbox.Attempt{{OutboxID: replayed, Number: 1, StartedAt: time.Now(), Outcome: "sent", HTTPStatus: 201}})
	if got := outcomes(replayed); got != "1:permanent:false 1:sent:false" {
		t.Errorf("replayed, then sent: %s", got)
	}

	// The attempts that spent one add up to each row's count, the replayed
	// row's since its replay; a row charged for an attempt nobody made
	// does not.
	accounted := []uuid.UUID{once, limited, retried, unanswered, replayed}
	if n, err := outbox.MiscountedAttempts(ctx, pool, accounted); err != nil || n != 0 {
		t.Errorf("miscounted attempts = %d, %v; want 0", n, err)
	}
	exec(t, pool, `UPDATE sms_outbox SET attempt_count = 2 WHERE id = $1`, limited)
	if n, err := outbox.MiscountedAttempts(ctx, pool, accounted); err != nil || n != 1 {
		t.Errorf("miscounted attempts after a charge nobody made = %d, %v; want 1", n, err)
	}

	// Not sent: nothing.
	pending := enqueue(t, pool, "+15551234571", "e")
	if got := outcomes(pending); got != "" {
		t.Errorf("pending: %s", got)
	}
}

// A delivery handed back unclaimed is recorded where the row accounts for
// the delivery before it, or for the first delivery of a message, so the
// next delivery's claim shows it; a row that does not account for the
// delivery before (a claim a failover lost) records nothing, and keeps
// that doubt; a finished row records nothing.
func TestHandBack(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	first := enqueue(t, pool, "+15551234567", "a")
	chained := enqueue(t, pool, "+15551234568", "b")
	lost := enqueue(t, pool, "+15551234569", "c")
	done := enqueue(t, pool, "+15551234570", "d")
	live := enqueue(t, pool, "+15551234571", "e")
	// chained: claimed by delivery 3 of message 7, which wrote a retry.
	exec(t, pool, `UPDATE sms_outbox SET status = 'queued', attempt_count = 1, claim_seq = 7, claim_delivery = 3 WHERE id = $1`, chained)
	// lost: the row shows delivery 1 of message 9; delivery 2's claim was lost.
	exec(t, pool, `UPDATE sms_outbox SET status = 'queued', attempt_count = 1, claim_seq = 9, claim_delivery = 1 WHERE id = $1`, lost)
	exec(t, pool, `UPDATE sms_outbox SET status = 'sent', claim_seq = 11, claim_delivery = 1 WHERE id = $1`, done)
	// live: another claim holds it, from delivery 1 of message 13; a
	// second copy (message 14, delivery 1) backs off.
	other := uuid.New()
	exec(t, pool, `UPDATE sms_outbox SET status = 'sending', attempt_count = 1, claim_id = $2, lease_until = now() + interval '1 minute',
		claim_seq = 13, claim_delivery = 1 WHERE id = $1`, live, other)

	n, err := outbox.HandBack(ctx, pool,
		[]uuid.UUID{first, chained, lost, done, live},
		[]outbox.Delivery{{Seq: 5, Count: 1}, {Seq: 7, Count: 4}, {Seq: 9, Count: 3}, {Seq: 11, Count: 2}, {Seq: 14, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("HandBack recorded %d rows, want 3 (first, chained, live)", n)
	}
	// A second hand-back continues the chain from the first.
	if n, err := outbox.HandBack(ctx, pool, []uuid.UUID{chained}, []outbox.Delivery{{Seq: 7, Count: 5}}); err != nil || n != 1 {
		t.Fatalf("second hand-back of chained = %d, %v; want 1", n, err)
	}
	// The claims that follow see what was handed back.
	want := map[uuid.UUID]outbox.Delivery{
		first: {Seq: 5, Count: 1}, chained: {Seq: 7, Count: 5}, lost: {},
	}
	for id, back := range want {
		c := claimOne(t, pool, id, uuid.New())
		if c.Result != outbox.Claimed || c.HandedBack != back {
			t.Errorf("claim of %s: %v, handed back %+v; want claimed, handed back %+v", id, c.Result, c.HandedBack, back)
		}
	}
	// The live claim was left alone: its token and lease hold.
	var claim uuid.UUID
	var seq, back int64
	if err := pool.QueryRow(ctx, `SELECT claim_id, claim_seq, handback_seq FROM sms_outbox WHERE id = $1`, live).Scan(&claim, &seq, &back); err != nil {
		t.Fatal(err)
	}
	if claim != other || seq != 13 || back != 14 {
		t.Errorf("live row: claim %s seq %d, handed back from %d; want the other claim's, seq 13, 14", claim, seq, back)
	}
}
