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
	"github.com/sendonce/sendonce/internal/pgtest"
)

// planConn opens a one-connection pool on url with AllowGenericPlans, as a
// sender's, and returns its connection and its plan_cache_mode.
func planConn(t *testing.T, url string) (*pgxpool.Conn, string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := outbox.PoolConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	outbox.AllowGenericPlans(cfg)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	var mode string
	if err := conn.QueryRow(ctx, `SHOW plan_cache_mode`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	return conn, mode
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
		if _, err := outbox.ClaimForSend(ctx, conn, ids, time.Minute, token); err != nil {
			t.Fatal(err)
		}
	}
	var name string
	var generic int64
	err := conn.QueryRow(ctx, `SELECT name, generic_plans FROM pg_prepared_statements
		WHERE statement LIKE '%WITH cur AS%FOR NO KEY UPDATE OF o%'`).Scan(&name, &generic)
	if err != nil {
		t.Fatalf("the claim is not a prepared statement of the connection: %v", err)
	}
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, fmt.Sprintf(`EXPLAIN (COSTS OFF) EXECUTE %s('{%s}', '1 minute', '%s')`, name, ids[0], token))
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return generic, plan.String()
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
	var size int64
	if err := pool.QueryRow(context.Background(), `SELECT pg_relation_size('sms_outbox')`).Scan(&size); err != nil {
		t.Fatal(err)
	}
	if size < outbox.GenericPlansMinBytes {
		t.Fatalf("6,000 rows take %d bytes, below %d", size, outbox.GenericPlansMinBytes)
	}
	conn, mode = planConn(t, url)
	if mode != "auto" {
		t.Fatalf("plan_cache_mode %q on a %d-byte table, want auto", mode, size)
	}
	generic, plan = claimPlans(t, conn, large[:20])
	if generic == 0 {
		t.Fatal("no generic plan of the claim in ten executions on a large table")
	}
	if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "sms_outbox_pkey") {
		t.Fatalf("the generic plan of the claim on a large table does not go through the primary key:\n%s", plan)
	}
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
