package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The monitor's age queries read the first entries of their partial
// indexes, however large the backlog: each plan is a Limit over an index,
// never a scan of every row in the state it measures. A plain
// min(created_at) over the pending rows was planned as a sequential scan
// of the whole table here, since the pending index is ordered by priority
// first.
func TestAgeQueriesReadTheFirstIndexEntries(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	pgtest.LoadRows(t, pool, 5000, string(StatusPending))
	// Thousands of rows in each state an age is measured over; the oldest
	// pending row is a bulk one, behind the normal rows in the index.
	if _, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, priority)
		SELECT gen_random_uuid(), '+15550000001', 'x', s, CASE WHEN i % 2 = 0 THEN 1 ELSE 2 END
		FROM unnest(ARRAY['queued', 'sending', 'sent', 'dead']) AS s, generate_series(1, 2000) AS i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, priority, created_at)
		VALUES (gen_random_uuid(), '+15550000001', 'old bulk', 3, now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
	for name, sql := range map[string]string{
		"pending": oldestPendingSQL, "in flight": oldestInFlightSQL,
		"finished": oldestFinishedSQL, "urgent": oldestUrgentSQL,
	} {
		plan := pgtest.Explain(t, pool, sql)
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Limit") || !strings.Contains(plan, "Index") {
			t.Errorf("the oldest %s query does not read the first entries of an index:\n%s", name, plan)
		}
	}
	age, err := OldestPendingAge(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if age < 2*time.Hour-time.Minute || age > 2*time.Hour+time.Minute {
		t.Fatalf("oldest pending age %s, want about 2h (the bulk row's)", age)
	}
}

// Dead and unknown rows are counted in one read of their partial index,
// of at most the bound's entries: below it both counts are exact; at it
// both are estimates from the statistics.
func TestCountEndedIsBounded(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, end_reason, letter_seq, maybe_accepted)
		SELECT gen_random_uuid(), '+15550000001', 'x', s, 'permanent', 1, false
		FROM unnest(ARRAY['dead', 'dead', 'dead', 'unknown', 'unknown', 'sent']) AS s`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
	if dead, unknown, est, err := countEnded(ctx, pool, 100); err != nil || dead != 3 || unknown != 2 || est {
		t.Errorf("countEnded(100) = %d, %d, %v, %v; want 3, 2, counted", dead, unknown, est, err)
	}
	dead, unknown, est, err := countEnded(ctx, pool, 4)
	if err != nil || !est || dead < 1 || unknown < 1 {
		t.Errorf("countEnded(4) = %d, %d, %v, %v; want estimates", dead, unknown, est, err)
	}
}
