package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// planPool opens a one-connection pool on url with AllowGenericPlans, as a
// sender's, checking the table's size again after recheck.
func planPool(t *testing.T, url string, recheck time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := outbox.PoolConfig(url, outbox.NoPooler)
	if err != nil {
		t.Fatal(err)
	}
	outbox.AllowGenericPlans(cfg, recheck)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// acquire returns pool's connection and its plan_cache_mode.
func acquire(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Conn, string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := conn.QueryRow(ctx, `SHOW plan_cache_mode`).Scan(&mode); err != nil {
		conn.Release()
		t.Fatal(err)
	}
	return conn, mode
}

// planConn is a connection of a new planPool and its plan_cache_mode.
func planConn(t *testing.T, url string) (*pgxpool.Conn, string) {
	t.Helper()
	conn, mode := acquire(t, planPool(t, url, time.Hour))
	t.Cleanup(conn.Release)
	return conn, mode
}

// pages returns sms_outbox's size as the planner last recorded it.
func pages(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT relpages FROM pg_class WHERE oid = 'sms_outbox'::regclass`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// claimPlans runs the senders' claim of ids ten times on conn (Postgres
// considers a generic plan from the sixth, and takes it when it costs no
// more than planning for the parameters: for a busy sender's batches of
// tens of rows, not for one row) and returns how many generic plans the
// statement used, and the plan a generic plan of it has on conn's table
// now.
func claimPlans(t *testing.T, conn *pgxpool.Conn, ids []uuid.UUID) (int64, string) {
	t.Helper()
	ctx := context.Background()
	token := uuid.New()
	for range 10 {
		if _, err := outbox.ClaimForSend(ctx, conn, ids, nil, time.Minute, token); err != nil {
			t.Fatal(err)
		}
	}
	var name string
	var generic int64
	// The query names the claim's text: it must not find itself.
	err := conn.QueryRow(ctx, `SELECT name, generic_plans FROM pg_prepared_statements
		WHERE statement LIKE '%WITH cur AS%FOR NO KEY UPDATE OF o%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&name, &generic)
	if err != nil {
		t.Fatalf("the claim is not a prepared statement of the connection: %v", err)
	}
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	plan := pgtest.Explain(t, conn, fmt.Sprintf(`EXECUTE %s('{%s}', '1 minute', '%s', '{0}', '{0}', '', '', '{""}')`, name, ids[0], token))
	return generic, plan
}

// A connection opened while sms_outbox is small keeps custom plans: a
// generic plan made then would scan the whole table, as the plan shown here
// does. One opened on a table of GenericPlansMinBytes reuses a generic plan
// of the claim, and that plan finds rows through the primary key.
func TestGenericPlansOnlyOnALargeTable(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)

	small := pgtest.LoadRows(t, pool, 20, "queued")
	conn, mode := planConn(t, url)
	if mode != "force_custom_plan" {
		t.Fatalf("plan_cache_mode %q on a 20-row table, want force_custom_plan", mode)
	}
	generic, plan := claimPlans(t, conn, small)
	if generic != 0 {
		t.Fatalf("%d generic plans on a 20-row table", generic)
	}
	if !strings.Contains(plan, "Seq Scan on sms_outbox") {
		t.Fatalf("a generic plan of the claim on a 20-row table reads it without a sequential scan, so the size check guards nothing:\n%s", plan)
	}
	conn.Release()

	large := pgtest.LoadRows(t, pool, 6000, "queued")
	if n := pages(t, pool); n < outbox.GenericPlansMinPages {
		t.Fatalf("6,000 rows take %d pages, below %d", n, outbox.GenericPlansMinPages)
	}
	conn, mode = planConn(t, url)
	if mode != "auto" {
		t.Fatalf("plan_cache_mode %q on a %d-page table, want auto", mode, pages(t, pool))
	}
	generic, plan = claimPlans(t, conn, large[:20])
	if generic == 0 {
		t.Fatal("no generic plan of the claim in ten executions on a large table")
	}
	// The batch's rows are found through the primary key (Index Cond),
	// not by reading all of it (Filter) or the table. The suppression
	// list, empty here, is read whole (a page at most).
	if strings.Contains(plan, "Seq Scan on sms_outbox") || strings.Contains(plan, "Filter: (id = ANY") || !strings.Contains(plan, "Index Cond: (id = ANY") {
		t.Fatalf("the generic plan of the claim on a large table does not find the batch through the primary key:\n%s", plan)
	}
	conn.Release()

	// A large list (statistics up to date, as an import leaves them) is
	// probed by its key, one entry per row, in a plan made again for it.
	if _, err := pool.Exec(context.Background(), `INSERT INTO sms_suppressions (number, source)
		SELECT '+1666' || lpad(g::text, 7, '0'), 'import' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `SELECT sendonce_suppression_analyze()`); err != nil {
		t.Fatal(err)
	}
	conn, _ = planConn(t, url)
	_, plan = claimPlans(t, conn, large[20:40])
	if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Index Scan using sms_suppressions_pkey") {
		t.Fatalf("the generic plan of the claim reads a large suppression list without its key:\n%s", plan)
	}
}

// A connection goes back to custom plans once the table has shrunk, and to
// generic plans once it has grown again, at its first acquisition after
// the recheck interval.
func TestGenericPlansFollowTheTablesSize(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	pgtest.LoadRows(t, pool, 6000, "queued")
	plans := planPool(t, url, 10*time.Millisecond)
	want := func(step, mode string) {
		t.Helper()
		time.Sleep(20 * time.Millisecond)
		conn, got := acquire(t, plans)
		conn.Release()
		if got != mode {
			t.Fatalf("%s (%d pages): plan_cache_mode %q, want %q", step, pages(t, pool), got, mode)
		}
	}
	want("large table", "auto")
	pgtest.LoadRows(t, pool, 20, "queued")
	want("after a truncation to 20 rows", "force_custom_plan")
	pgtest.LoadRows(t, pool, 6000, "queued")
	want("grown again", "auto")
}

// A DSN that sets plan_cache_mode keeps it, whatever the table's size.
func TestGenericPlansLeaveTheDSNsChoice(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	pgtest.LoadRows(t, pool, 6000, "queued")
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	_, mode := planConn(t, url+sep+"plan_cache_mode=force_custom_plan")
	if mode != "force_custom_plan" {
		t.Fatalf("plan_cache_mode %q, want the DSN's force_custom_plan", mode)
	}
}

// The relay marks a batch queued through the primary key, reading no
// other row: Postgres's own costs hash every pending row of a table of
// tens of thousands instead, in the relay's transaction, once a batch.
func TestMarkQueuedReadsOnlyItsBatch(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewPool(t)
	cfg, err := outbox.PoolConfig(url, outbox.NoPooler)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pgtest.LoadRows(t, pool, 20000, "pending")
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	batch, err := outbox.ClaimPending(ctx, tx, 500)
	if err != nil || len(batch) != 500 {
		t.Fatalf("ClaimPending = %d rows, %v", len(batch), err)
	}
	ids, seqs := make([]uuid.UUID, len(batch)), make([]int64, len(batch))
	for i, p := range batch {
		ids[i], seqs[i] = p.ID, int64(i+1)
	}
	if n, err := outbox.MarkQueued(ctx, tx, ids, seqs); err != nil || n != 500 {
		t.Fatalf("MarkQueued = %d, %v", n, err)
	}
	var read int64
	if err := tx.QueryRow(ctx, `SELECT seq_tup_read FROM pg_stat_xact_user_tables WHERE relid = 'sms_outbox'::regclass`).Scan(&read); err != nil {
		t.Fatal(err)
	}
	if read != 0 {
		t.Fatalf("the relay's transaction read %d rows of sms_outbox in sequential scans for a batch of 500", read)
	}
}
