package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/testing/pgserver"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testport"
	"github.com/sendonce/sendonce/outbox"
)

// cluster is a throwaway Postgres server the test owns, so it can restart it.
type cluster struct {
	t   *testing.T
	srv *pgserver.Server
}

// startCluster runs initdb and starts the server (as the postgres user when
// the test runs as root, since Postgres refuses to run as root). It skips
// only where no Postgres server binaries exist.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	bin, err := pgserver.FindBin()
	if err != nil {
		t.Skip(err)
	}
	dir, err := pgserver.NewDir("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A port outside the ephemeral range, so it is still free after restart.
	srv, err := pgserver.Init(ctx, bin, dir, "data", testport.Reserve(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.StopQuietly)
	return &cluster{t: t, srv: srv}
}

// restart stops the server (fast: connections are cut), waits, starts it.
func (c *cluster) restart(down time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.srv.Stop(ctx); err != nil {
		c.t.Fatal(err)
	}
	time.Sleep(down)
	if err := c.srv.Start(ctx); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) url(db string) string { return c.srv.URL(db) }

// 11b. A real Postgres restart mid-stream: connections die, the relay and
// the senders reconnect, and nothing is lost or sent twice.
func TestChaosPostgresRestart(t *testing.T) {
	t.Parallel()
	pg := startCluster(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pg.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE sendonce"); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	if err := pgtest.Migrate(ctx, pg.url("sendonce")); err != nil {
		t.Fatal(err)
	}
	e := setup(t, envOptions{}) // NATS, stub and a database we do not use
	pool, err := pgxpool.New(ctx, pg.url("sendonce"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.pool = pool
	e.auditStatuses()
	e.startRelay(relay.Config{DBTimeout: 2 * time.Second})
	e.startSender(senderOptions{cfg: sender.Config{DBTimeout: 2 * time.Second}})

	var ids []uuid.UUID
	for i := 0; i < 400; i++ {
		if i == 150 {
			pg.restart(2 * time.Second)
		}
		// An application retries its transaction when the database is down.
		for try := 0; ; try++ {
			var id uuid.UUID
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				id, err = outbox.Enqueue(ctx, tx, testPhone(i), testBody(i))
				return err
			})
			if err == nil {
				ids = append(ids, id)
				break
			}
			if try > 100 {
				t.Fatalf("insert %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rows := e.checkInvariants(ids, 3*time.Minute)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			t.Errorf("row %s ended %s", id, rows[id].status)
		}
	}
}
