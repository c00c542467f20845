package outbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The sweep's statements and the backlog's measure read bounded ranges of
// partial indexes on a table of 100,000 final rows spread over two days,
// most of them delivered, whether Postgres plans them for their parameters
// or (as on a sender's connections to a large table) generically:
//
//   - the scan of rows becoming overdue reads the entries of
//     sms_outbox_final_idx in order from its start, an index-only scan under
//     a Limit, and fetches only the sent ones' rows, through the same index
//     by their time: a stretch of delivered rows costs no heap access;
//   - the claim of due looks and the backlog read the first entries of
//     sms_outbox_overdue_idx, which holds the marked rows only.
//
// A plain "status = 'sent' AND updated_at < now() - overdue" was planned as
// a scan of every final row older than the overdue time (two days of
// traffic here) with a heap fetch each, to find the few sent ones.
func TestOverdueQueriesReadBoundedIndexRanges(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	pgtest.LoadRows(t, pool, 100_000, string(StatusDelivered))
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// Two days of final rows; one in a hundred still sent, one in a
	// thousand of those marked; a few hundred in flight.
	exec(`UPDATE sms_outbox SET updated_at = now() - (random() * interval '48 hours'),
		status = CASE WHEN random() < 0.01 THEN 'sent' WHEN random() < 0.003 THEN 'queued' ELSE status END`)
	exec(`UPDATE sms_outbox SET lookup_pending = true, next_attempt_at = now() - random() * interval '1 hour'
		WHERE status = 'sent' AND random() < 0.1`)
	exec(`VACUUM ANALYZE sms_outbox`)

	type query struct {
		name, sql string
		args      []any
		want      []string // lines the plan must hold
	}
	queries := []query{
		{"mark overdue", markOverdueSQL,
			[]any{time.Time{}, time.Hour, 5000, time.Hour, true},
			[]string{"Limit", "Index Only Scan using sms_outbox_final_idx", "Index Scan using sms_outbox_final_idx on sms_outbox o"}},
		{"claim due looks", claimOverdueSQL,
			[]any{10, []float64{3600, 7200}, 60.0},
			[]string{"Limit", "Index Scan using sms_outbox_overdue_idx"}},
		{"backlog", overdueBacklogSQL,
			[]any{100_000},
			[]string{"Limit", "Index Only Scan using sms_outbox_overdue_idx"}},
	}
	check := func(how string, q query, plan string) {
		t.Helper()
		for _, w := range q.want {
			if !strings.Contains(plan, w) {
				t.Errorf("%s, %s: the plan has no %q:\n%s", q.name, how, w, plan)
			}
		}
		if strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Bitmap") {
			t.Errorf("%s, %s: the plan reads more than a range of an index:\n%s", q.name, how, plan)
		}
	}
	for _, q := range queries {
		// Data-modifying statements are explained in a transaction rolled
		// back: EXPLAIN alone does not run them, but keeps it so.
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		check("custom plan", q, pgtest.Explain(t, tx, q.sql, q.args...))
		_ = tx.Rollback(ctx)
		check("generic plan", q, genericPlan(t, pool, q.sql, len(q.args)))
	}

	// The scan reads one chunk's entries however many rows there are, and
	// moves on from the last.
	s, err := MarkOverdue(ctx, pool, time.Time{}, time.Hour, time.Hour, 1000, true)
	if err != nil {
		t.Fatal(err)
	}
	if s.Read != 1000 || s.Last.IsZero() || s.Last.After(s.Upto) {
		t.Fatalf("a chunk of 1000 read %d entries, last %s, up to %s", s.Read, s.Last, s.Upto)
	}
}

// genericPlan returns the generic plan of sql (with n parameters, their
// types inferred) on a connection of pool.
func genericPlan(t *testing.T, pool *pgxpool.Pool, sql string, n int) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `PREPARE overdue_plan AS `+sql); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `DEALLOCATE overdue_plan`) }()
	// Parameter values do not shape a generic plan: NULLs of the inferred
	// types do.
	nulls := strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ")
	return pgtest.Explain(t, tx, fmt.Sprintf(`EXECUTE overdue_plan(%s)`, nulls))
}
