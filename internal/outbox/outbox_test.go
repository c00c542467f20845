package outbox_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/pgtest"
	app "github.com/sendonce/sendonce/outbox"
)

func enqueue(t *testing.T, pool *pgxpool.Pool, to, body string) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		id, err = app.Enqueue(context.Background(), tx, to, body)
		return err
	})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return id
}

func TestRelayClaimSkipsLockedRows(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		enqueue(t, pool, "+15551234567", "x")
	}
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	first, err := outbox.ClaimPending(ctx, tx1, 6)
	if err != nil || len(first) != 6 {
		t.Fatalf("claim 1: %d rows, %v", len(first), err)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	second, err := outbox.ClaimPending(ctx, tx2, 6)
	if err != nil || len(second) != 4 {
		t.Fatalf("claim 2: %d rows, %v (want the 4 unlocked)", len(second), err)
	}
	seen := map[uuid.UUID]bool{}
	for _, p := range append(first, second...) {
		if seen[p.ID] {
			t.Fatalf("row %s claimed twice", p.ID)
		}
		seen[p.ID] = true
	}
	ids := make([]uuid.UUID, len(second))
	for i, p := range second {
		ids[i] = p.ID
	}
	if n, err := outbox.MarkQueued(ctx, tx2, ids, []int64{1, 2, 3, 4}); err != nil || n != 4 {
		t.Fatalf("MarkQueued = %d, %v", n, err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = tx1.Rollback(ctx)
	var pending, queued int
	_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status='pending'), count(*) FILTER (WHERE status='queued') FROM sms_outbox`).Scan(&pending, &queued)
	if pending != 6 || queued != 4 {
		t.Fatalf("pending=%d queued=%d, want 6 and 4 (a rolled-back claim returns rows)", pending, queued)
	}
}

func TestClaimForSend(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	// Long, so that the live row is still leased however slow the machine;
	// the stale one is an hour old.
	lease := time.Minute
	queued := enqueue(t, pool, "+15551234567", "a")
	pending := enqueue(t, pool, "+15551234568", "b")
	sent := enqueue(t, pool, "+15551234569", "c")
	stale := enqueue(t, pool, "+15551234570", "d")
	live := enqueue(t, pool, "+15551234571", "e")
	waiting := enqueue(t, pool, "+15551234572", "f")
	missing := uuid.New()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE sms_outbox SET status='queued' WHERE id = $1`, queued)
	exec(`UPDATE sms_outbox SET status='sent', provider_ref='msg_1' WHERE id = $1`, sent)
	exec(`UPDATE sms_outbox SET status='sending', attempt_count=1, updated_at=now()-interval '1 hour' WHERE id = $1`, stale)
	exec(`UPDATE sms_outbox SET status='sending', attempt_count=1, updated_at=now() WHERE id = $1`, live)
	exec(`UPDATE sms_outbox SET status='queued', attempt_count=1, next_attempt_at=now()+interval '1 minute' WHERE id = $1`, waiting)

	claims, err := outbox.ClaimForSend(ctx, pool, []uuid.UUID{queued, pending, sent, stale, live, waiting, missing, queued}, lease)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]outbox.Claim{}
	for _, c := range claims {
		got[c.ID] = c
	}
	if len(claims) != 7 {
		t.Fatalf("%d claims, want 7 (one per distinct id)", len(claims))
	}
	want := map[uuid.UUID]outbox.ClaimResult{
		queued: outbox.Claimed, pending: outbox.Claimed, sent: outbox.AlreadyTerminal,
		stale: outbox.ClaimedStale, live: outbox.Leased, waiting: outbox.Leased, missing: outbox.NotFound,
	}
	for id, w := range want {
		if got[id].Result != w {
			t.Errorf("row %s: result %d, want %d", id, got[id].Result, w)
		}
	}
	if c := got[queued]; c.To != "+15551234567" || c.Body != "a" || c.Attempt != 1 || c.MaxAttempts != 8 {
		t.Errorf("claimed row = %+v", c)
	}
	if c := got[stale]; c.Attempt != 2 {
		t.Errorf("stale row attempt = %d, want 2", c.Attempt)
	}
	if c := got[live]; c.LeaseLeft <= 0 || c.LeaseLeft > lease {
		t.Errorf("live lease left = %s", c.LeaseLeft)
	}
	if c := got[waiting]; c.LeaseLeft < 50*time.Second {
		t.Errorf("waiting row: wait %s, want about a minute", c.LeaseLeft)
	}
	// A second claim of the same rows finds them leased: a concurrent
	// delivery never calls the provider.
	again, err := outbox.ClaimForSend(ctx, pool, []uuid.UUID{queued}, lease)
	if err != nil || len(again) != 1 || again[0].Result != outbox.Leased {
		t.Fatalf("second claim = %+v, %v; want Leased", again, err)
	}
}

func TestWriteResultsGuards(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	a := enqueue(t, pool, "+15551234567", "a")
	b := enqueue(t, pool, "+15551234567", "b")
	c := enqueue(t, pool, "+15551234567", "c")
	lease := map[uuid.UUID]time.Time{} // the latest claim's lease per row
	claim := func(id uuid.UUID) outbox.Claim {
		t.Helper()
		claims, err := outbox.ClaimForSend(ctx, pool, []uuid.UUID{id}, time.Minute)
		if err != nil || len(claims) != 1 || claims[0].Lease.IsZero() {
			t.Fatalf("claim %s = %+v, %v", id, claims, err)
		}
		lease[id] = claims[0].Lease
		return claims[0]
	}
	claim(a)
	claim(b)
	claim(c)
	first := maps.Clone(lease)
	write := func(rs ...outbox.Result) int64 {
		t.Helper()
		var n int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			applied, err := outbox.ApplyResults(ctx, tx, rs, nil)
			n = int64(len(applied))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := write(
		outbox.Result{ID: a, Status: outbox.StatusSent, ProviderRef: "msg_a"},
		outbox.Result{ID: b, Status: outbox.StatusQueued, Error: "http 503", RetryAt: time.Now().Add(time.Second), Attempt: 1, Lease: lease[b]},
		outbox.Result{ID: c, Status: outbox.StatusDead, Error: "http 400\x00 with a NUL and \xff bad UTF-8", Attempt: 1, Lease: lease[c]},
	)
	if n != 3 {
		t.Fatalf("first write changed %d rows, want 3", n)
	}
	// Late or duplicate outcomes never move a terminal row.
	n = write(
		outbox.Result{ID: a, Status: outbox.StatusDead, Error: "late", Attempt: 1, Lease: lease[a]},
		outbox.Result{ID: c, Status: outbox.StatusSent, ProviderRef: "msg_c"},
		outbox.Result{ID: a, Status: outbox.StatusQueued, Error: "late retry", Attempt: 1, Lease: lease[a]},
	)
	if n != 0 {
		t.Fatalf("late writes changed %d rows, want 0", n)
	}
	// A write from an overtaken attempt changes nothing: b is claimed again
	// (attempt 2), and attempt 1's second, late retry write must not move it.
	claim(b)
	if n := write(outbox.Result{ID: b, Status: outbox.StatusQueued, Error: "stale", RetryAt: time.Now(), Attempt: 1, Lease: first[b]}); n != 0 {
		t.Fatalf("a retry write from attempt 1 changed attempt 2's row")
	}
	if n := write(outbox.Result{ID: b, Status: outbox.StatusUnknown, Error: "stale", Attempt: 1, Lease: first[b]}); n != 0 {
		t.Fatalf("an unknown write from attempt 1 changed attempt 2's row")
	}
	// A republication by the reconciler overlapping a slow attempt keeps
	// its lease: the attempt still owns the row and its write applies.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.MarkRepublished(ctx, tx, b, 1, 42) }); err != nil {
		t.Fatal(err)
	}
	if n := write(outbox.Result{ID: b, Status: outbox.StatusQueued, Error: "mine", RetryAt: time.Now(), Attempt: 2, Lease: lease[b]}); n != 1 {
		t.Fatalf("the owning attempt's write did not apply")
	}
	// A write from before a replay changes nothing either: c is replayed
	// (attempts counted from zero) and claimed again as attempt 1, the
	// number the pre-replay attempt had.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Replay(ctx, tx, []uuid.UUID{c}, false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if cl := claim(c); cl.Attempt != 1 {
		t.Fatalf("claim after replay = %+v; want attempt 1", cl)
	}
	if n := write(outbox.Result{ID: c, Status: outbox.StatusUnknown, Error: "from before the replay", Attempt: 1, Lease: first[c]}); n != 0 {
		t.Fatalf("a write from before the replay changed the replayed row")
	}
	if n := write(outbox.Result{ID: c, Status: outbox.StatusDead, Error: "http 400\x00 with a NUL and \xff bad UTF-8", Attempt: 1, Lease: lease[c]}); n != 1 {
		t.Fatalf("the replayed row's own attempt's write did not apply")
	}
	if st, _ := app.Status(ctx, pool, c); !utf8.ValidString(st.LastError) || strings.ContainsRune(st.LastError, 0) {
		t.Errorf("last_error %q was stored unclean", st.LastError)
	}
	for id, want := range map[uuid.UUID]outbox.State{a: outbox.StatusSent, b: outbox.StatusQueued, c: outbox.StatusDead} {
		st, err := app.Status(ctx, pool, id)
		if err != nil || st.Status != want {
			t.Errorf("row %s: %+v, %v; want %s", id, st, err, want)
		}
	}
	if st, _ := app.Status(ctx, pool, a); st.ProviderRef != "msg_a" {
		t.Errorf("provider_ref = %q", st.ProviderRef)
	}
}

// maybe_accepted is sticky: once an attempt may have reached the provider
// (a retry that says so, or a stale claim taking over an attempt that never
// reported back), every later claim sees it, whatever later attempts say.
func TestMaybeAcceptedIsSticky(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	lost := enqueue(t, pool, "+15551234567", "a")
	refused := enqueue(t, pool, "+15551234568", "b")
	stale := enqueue(t, pool, "+15551234569", "c")
	claim := func(id uuid.UUID) outbox.Claim {
		t.Helper()
		cs, err := outbox.ClaimForSend(ctx, pool, []uuid.UUID{id}, time.Minute)
		if err != nil || len(cs) != 1 || (cs[0].Result != outbox.Claimed && cs[0].Result != outbox.ClaimedStale) {
			t.Fatalf("claim %s = %+v, %v", id, cs, err)
		}
		return cs[0]
	}
	retry := func(c outbox.Claim, maybe bool) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			applied, err := outbox.ApplyResults(ctx, tx, []outbox.Result{{
				ID: c.ID, Status: outbox.StatusQueued, Error: "x", RetryAt: time.Now(), Attempt: c.Attempt, Lease: c.Lease, MaybeAccepted: maybe,
			}}, nil)
			if err == nil && !applied[c.ID] {
				err = fmt.Errorf("retry of %s not applied", c.ID)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
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
	if _, err := pool.Exec(ctx, `UPDATE sms_outbox SET updated_at = now() - interval '1 hour' WHERE id = $1`, stale); err != nil {
		t.Fatal(err)
	}
	if c = claim(stale); c.Result != outbox.ClaimedStale || !c.MaybeAccepted {
		t.Fatalf("stale claim = %+v, want ClaimedStale and MaybeAccepted", c)
	}
}
