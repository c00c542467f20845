package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/pgbouncer"
	"github.com/sendonce/sendonce/internal/pgtest"
	"github.com/sendonce/sendonce/internal/testkit"
	"github.com/sendonce/sendonce/internal/testport"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// Through a transaction pooler two statements outside a transaction may
// reach two server sessions: what one session set, the next does not see.
// The pooler these tests run is that pooler.
func TestTransactionPoolingSharesNoSession(t *testing.T) {
	if _, err := pgbouncer.Bin(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	port, err := testport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgbouncer.Start(ctx, pgbouncer.Config{Upstream: pgtest.Host(), Mode: pgbouncer.Transaction, Port: port, PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	cfg, err := pgx.ParseConfig(b.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	a, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	other, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	// Hold one server session in a transaction on the other client: a's
	// next statement gets the other server session.
	if _, err := a.Exec(ctx, `SET application_name = 'mine'`); err != nil {
		t.Fatal(err)
	}
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	var pid1, pid2 int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid1); err != nil {
		t.Fatal(err)
	}
	if err := a.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid2); err != nil {
		t.Fatal(err)
	}
	if pid1 == pid2 {
		t.Fatalf("two clients in one server session at once (pid %d): not transaction pooling", pid1)
	}
}
