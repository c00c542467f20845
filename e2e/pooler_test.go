package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgbouncer"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/outbox"
)

// The relay and two senders, as the binaries, behind PgBouncer (Debian's
// package) in transaction and in session mode, with DATABASE_POOLER set as
// docs/operations.md says and nothing else: no startup parameter the pooler
// refuses, no prepared statement that outlives its transaction, no LISTEN
// through a transaction pooler (the relay polls, and says so once). The
// application writes through the pooler too. 2,000 rows are sent once
// each, and no process exits on its own.
func TestPipelineBehindPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{pgbouncer.Transaction, pgbouncer.Session} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			direct := pgtest.NewMigrated(t)
			b := pgbouncer.ForTest(t, pgbouncer.Config{Mode: mode, PoolSize: 10})
			pooled := b.Pooled(t, direct)

			srv := natstest.Start(t)
			const apiKey = "pooler-test-key-7c1e"
			stub := startProcess(t, "smsstub", []string{"SMS_API_KEY=" + apiKey}, "-addr", "127.0.0.1:0")
			stubURL, err := stub.Announced(context.Background(), smsstub.Announcement, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			env := []string{
				"DATABASE_URL=" + pooled, "DATABASE_POOLER=" + mode, "NATS_URL=" + srv.URL(), "HTTP_ADDR=127.0.0.1:0",
				"SMS_API_BASE=" + stubURL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY=" + apiKey,
			}
			procs := []*process{startProcess(t, "relay", env), startProcess(t, "sender", env), startProcess(t, "sender", env)}

			// The application's pool through the pooler: unnamed statements
			// where a transaction pooler stands.
			cfg, err := pgxpool.ParseConfig(pooled)
			if err != nil {
				t.Fatal(err)
			}
			if mode == pgbouncer.Transaction {
				cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
			}
			app, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(app.Close)
			const n = 2000
			ids := insertVia(t, app, n)

			final := waitAllTerminal(t, newPool(t, direct), n, 3*time.Minute)
			deliveries, err := smsstub.FetchDeliveries(context.Background(), stubURL)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if final[id.String()] != outbox.StatusSent || deliveries[id.String()].Deliveries != 1 {
					t.Fatalf("row %s: %s, %d deliveries; want sent once", id, final[id.String()], deliveries[id.String()].Deliveries)
				}
			}
			for _, p := range procs {
				if p.Exited() {
					t.Fatalf("%s exited on its own: %v\n%s", p.Name(), p.Err(), p.logs.String())
				}
			}
			if mode == pgbouncer.Transaction && !strings.Contains(procs[0].logs.String(), "no LISTEN") {
				t.Errorf("the relay did not say that it polls:\n%s", procs[0].logs.String())
			}
			for _, p := range procs {
				if err, took := p.stop(t, 30*time.Second); err != nil {
					t.Errorf("%s exit after %s: %v", p.Name(), took, err)
				}
			}
		})
	}
}
