package outbox

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// applySends must write exactly what applyRound writes for plain sends,
// whatever state it finds a row in: each state is set up twice, one copy
// written each way, and the rows and the answers compared column by column
// (the clock's stamps by whether they moved: every row starts stamped in
// the past).
func TestApplySendsWritesWhatApplyRoundWrites(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	// The states a sent result can find: each one's columns as the SET of
	// an UPDATE, and the result's provider reference.
	states := []struct{ set, ref string }{
		{`status = 'pending'`, "msg_1"},
		{`status = 'queued', stream_seq = 7, next_attempt_at = '2026-02-02T00:00:00Z'`, "msg_2"},
		{`status = 'sending', attempt_count = 2, claim_id = '7d0b7c64-5f2a-4c59-9d5e-0a1b2c3d4e5f', lookups = 1, lookup_pending = true`, "msg_3"},
		{`status = 'sending', maybe_accepted = true, last_error = 'timeout'`, ""},
		{`status = 'unknown', maybe_accepted = true, end_reason = 'ambiguous', last_error = 'no answer'`, "msg_5"},
		{`status = 'sent', provider_ref = 'msg_old', sent_at = now() - interval '1 minute'`, "msg_6"},
		{`status = 'delivered', provider_ref = 'msg_old', sent_at = now()`, "msg_7"},
		{`status = 'dead', end_reason = 'permanent', last_error = 'rejected'`, "msg_8"},
		{`status = 'queued', provider_ref = 'msg_kept', publish_gen = 3`, ""},
		{`status = 'unknown', end_reason = 'ambiguous', last_error = 'no answer'`, "msg_10"},
		{`status = 'undelivered', provider_ref = 'msg_old', sent_at = now() - interval '1 hour'`, "msg_11"},
	}
	var general, fast []Result
	for i, st := range states {
		for _, into := range []*[]Result{&general, &fast} {
			id := uuid.New()
			// Stamped in the past, so that a write that forgets
			// updated_at shows.
			if _, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, next_attempt_at, created_at, updated_at)
				VALUES ($1, '+15550000001', 'hi', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')`, id); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE sms_outbox SET `+st.set+`, updated_at = '2026-01-01T00:00:00Z' WHERE id = $1`, id); err != nil {
				t.Fatalf("state %d: %v", i, err)
			}
			*into = append(*into, Result{ID: id, Status: StatusSent, ProviderRef: st.ref, Token: uuid.New()})
		}
	}
	if !plainSends(general) {
		t.Fatal("plainSends refuses a batch of plain sends")
	}
	write := func(apply func(context.Context, pgx.Tx, []Result, map[uuid.UUID]Written) error, rs []Result) map[uuid.UUID]Written {
		written := map[uuid.UUID]Written{}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return apply(ctx, tx, rs, written) }); err != nil {
			t.Fatal(err)
		}
		return written
	}
	wg, wf := write(applyRound, general), write(applySends, fast)
	if len(wg) != len(wf) {
		t.Fatalf("applyRound wrote %d rows, applySends %d", len(wg), len(wf))
	}
	// Every column but the id and the clock's stamps, which are compared
	// by whether they moved.
	const cols = `status, attempt_count, max_attempts, coalesce(provider_ref, '-'), coalesce(last_error, '-'),
		coalesce(end_reason, '-'), coalesce(next_attempt_at::text, '-'), coalesce(stream_seq, -1), maybe_accepted,
		lookup_pending, lookups, coalesce(claim_id::text, '-'), publish_gen, sent_at IS NULL,
		sent_at > now() - interval '10 seconds', updated_at > now() - interval '10 seconds'`
	row := func(id uuid.UUID) []any {
		rows, _ := pool.Query(ctx, `SELECT `+cols+` FROM sms_outbox WHERE id = $1`, id)
		vals, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		if err != nil {
			t.Fatal(err)
		}
		return vals
	}
	for i := range states {
		g, f := general[i], fast[i]
		if wg[g.ID] != wf[f.ID] {
			t.Errorf("state %d: applyRound answered %+v, applySends %+v", i, wg[g.ID], wf[f.ID])
		}
		rg, rf := row(g.ID), row(f.ID)
		for c := range rg {
			if rg[c] != rf[c] {
				t.Errorf("state %d (%s), column %d: applyRound left %v, applySends %v", i, states[i].set, c, rg[c], rf[c])
			}
		}
	}
	for _, r := range []Result{
		{Status: StatusQueued}, {Status: StatusSent, MaybeAccepted: true}, {Status: StatusSent, Refund: true},
		{Status: StatusSent, LookupPending: true}, {Status: StatusSent, LookupFailed: true},
		{Status: StatusSent, NotAccepted: true}, {Status: StatusSent, Lookup: &Evidence{}},
	} {
		if plainSends(append([]Result{{Status: StatusSent}}, r)) {
			t.Errorf("plainSends takes %+v for a plain send", r)
		}
	}
}
