package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/testing/pgbouncer"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// Through a transaction pooler two statements outside a transaction may
// reach two server sessions: what one session set, the next does not see.
// The pooler these tests run is that pooler.
func TestTransactionPoolingSharesNoSession(t *testing.T) {
	ctx := context.Background()
	b := pgbouncer.ForTest(t, pgbouncer.Config{Mode: pgbouncer.Transaction, PoolSize: 2})
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
