package outbox

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// loadTwinsTable fills sms_outbox with n rows over n*6 seconds of changes
// (the newest now), 20,000 numbers and 1,000 texts, in every status
// (80 % delivered, 5 % sent, 3 % undelivered, 2 % dead, 2 % unknown,
// 3 % queued, 2 % sending, 3 % pending), and analyzes it.
func loadTwinsTable(t *testing.T, q Querier, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := q.Exec(ctx, `
INSERT INTO sms_outbox (id, to_e164, body, status, created_at, updated_at, provider_ref, end_reason, maybe_accepted, attempt_count)
SELECT gen_random_uuid(), '+1555' || lpad((i % 20000)::text, 7, '0'), 'Your code is ' || (i % 1000) || '. It expires in 10 minutes.',
       s, now() - i * interval '6 seconds' - interval '2 seconds', now() - i * interval '6 seconds',
       CASE WHEN s IN ('sent', 'delivered', 'undelivered') THEN 'SM' || md5(i::text) END,
       CASE s WHEN 'dead' THEN 'permanent' WHEN 'unknown' THEN 'ambiguous' END,
       s IN ('queued', 'unknown') AND i % 2 = 0, CASE WHEN s = 'pending' THEN 0 ELSE 1 END
FROM (SELECT i, CASE WHEN (i * 37) % 100 < 80 THEN 'delivered' WHEN (i * 37) % 100 < 85 THEN 'sent'
                     WHEN (i * 37) % 100 < 88 THEN 'undelivered' WHEN (i * 37) % 100 < 90 THEN 'dead'
                     WHEN (i * 37) % 100 < 92 THEN 'unknown' WHEN (i * 37) % 100 < 95 THEN 'queued'
                     WHEN (i * 37) % 100 < 97 THEN 'sending' ELSE 'pending' END AS s
      FROM generate_series(1, $1::int) i) g`, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
}

// sharedBuffers is the first Buffers line of a plan: its top node's, the
// whole statement's.
var sharedBuffers = regexp.MustCompile(`Buffers: shared hit=(\d+)(?: read=(\d+))?`)

// On a 100,000-row outbox Twins reads the three partial indexes on
// updated_at over the window asked for, and the rows they point to: never
// the table, nor the pending rows. Measured with EXPLAIN (ANALYZE,
// BUFFERS): the buffers it touches for a 5-minute and a 1-hour window,
// against the table's pages.
func TestTwinsReadTheWindowNotTheTable(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	loadTwinsTable(t, pool, 100_000)
	var pages int
	if err := pool.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE oid = 'sms_outbox'::regclass`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	args := []any{uuid.New(), "+15550000050", time.Now().Add(-5 * time.Minute)}
	plan := pgtest.Explain(t, pool, twinsSQL, args...)
	for _, idx := range []string{"sms_outbox_inflight_idx", "sms_outbox_final_idx", "sms_outbox_dead_idx"} {
		if !strings.Contains(plan, "Index Scan using "+idx) && !strings.Contains(plan, "Bitmap Index Scan on "+idx) {
			t.Errorf("the plan does not read %s:\n%s", idx, plan)
		}
	}
	if strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "pending") {
		t.Errorf("the plan scans the table or the pending rows:\n%s", plan)
	}
	for _, window := range []time.Duration{5 * time.Minute, time.Hour} {
		args[2] = time.Now().Add(-window)
		rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) `+twinsSQL, append([]any{pgx.QueryExecModeExec}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		analyzed := strings.Join(lines, "\n")
		m := sharedBuffers.FindStringSubmatch(analyzed)
		if m == nil {
			t.Fatalf("no buffer count in:\n%s", analyzed)
		}
		buffers, _ := strconv.Atoi(m[1])
		if read, err := strconv.Atoi(m[2]); err == nil {
			buffers += read
		}
		t.Logf("%v window (%d rows changed): %d buffers of a %d-page table", window, int(window/(6*time.Second)), buffers, pages)
		if buffers*20 > pages {
			t.Errorf("a %v window touched %d buffers, more than 5 %% of the table's %d pages:\n%s", window, buffers, pages, analyzed)
		}
	}
}
