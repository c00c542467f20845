package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The relay measures the oldest open transaction of its database (a long
// one holds back vacuum) without reading any session's SQL: another
// database's session that ran a CREATE ROLE with a password and a SELECT
// with a number, and stays in its transaction, shows the relay's login
// neither in pg_stat_activity, while the relay's gauge still sees an open
// transaction of another role in its own database. The relay no longer
// holds pg_read_all_stats; it reads the one figure through
// sendonce_oldest_transaction(). Migration 0027.
func TestTheRelayReadsNoOtherSessionsSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Another database on the server, where someone's transaction is
	// open with secrets in its last statement.
	other, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	const secret = `SELECT 'CREATE ROLE mallory LOGIN PASSWORD ''hunter2-hunter2''' AS ddl, '+15559876543' AS number`
	if _, err := tx.Exec(ctx, secret); err != nil {
		t.Fatal(err)
	}
	var otherPID int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	// The query column shows the last statement: run the secret again.
	if _, err := tx.Exec(ctx, secret); err != nil {
		t.Fatal(err)
	}

	var relay *pgxpool.Pool
	var query string
	// The roles are the server's, and a database migrated by a release
	// before 0027 (another checkout's tests on a shared server) grants
	// pg_read_all_stats to sendonce_relay again: then this database's
	// migration is run once more on a fresh database, which takes it away.
	for try := 0; ; try++ {
		owner, url := pgtest.NewPool(t)
		relay = rolePool(t, url, "sendonce_relay")
		if err := relay.QueryRow(ctx, `SELECT coalesce(query, '') FROM pg_stat_activity WHERE pid = $1`, otherPID).Scan(&query); err != nil {
			t.Fatal(err)
		}
		var member bool
		if err := owner.QueryRow(ctx, `SELECT pg_has_role('sendonce_relay', 'pg_read_all_stats', 'USAGE')`).Scan(&member); err != nil {
			t.Fatal(err)
		}
		if !member || try == 2 {
			break
		}
		t.Logf("sendonce_relay holds pg_read_all_stats again (granted by another database's migration): trying once more")
	}
	if strings.Contains(query, "hunter2") || strings.Contains(query, "5559876543") {
		t.Errorf("the relay's login reads another session's SQL: %q", query)
	}

	// Its gauge still sees an open transaction of another role in its
	// database: the application's, here.
	_, url := pgtest.NewPool(t)
	relay = rolePool(t, url, "sendonce_relay")
	app, err := rolePool(t, url, "sendonce_app").Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Rollback(ctx)
	if _, err := app.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	age, err := outbox.OldestTransactionAge(ctx, relay)
	if err != nil || age <= 0 {
		t.Errorf("the relay's oldest-transaction gauge: %s, %v; want the application's open transaction's age", age, err)
	}
}
