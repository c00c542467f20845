package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/pgtest"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/testport"
	"github.com/sendonce/sendonce/outbox"
)

// cluster is a throwaway Postgres server the test owns, so it can restart it.
type cluster struct {
	t    *testing.T
	bin  string
	data string
	port int
	as   []string // runuser prefix when running as root
}

// startCluster runs initdb and pg_ctl (as the postgres user when the test
// runs as root, since Postgres refuses to run as root). It skips only where
// no Postgres server binaries exist.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		if p, err := exec.LookPath("initdb"); err == nil {
			matches = []string{p}
		}
	}
	if len(matches) == 0 {
		t.Skip("no Postgres server binaries (initdb) on this machine")
	}
	c := &cluster{t: t, bin: filepath.Dir(matches[len(matches)-1])}
	dir, err := os.MkdirTemp("", "sendonce-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.as = []string{"runuser", "-u", "postgres", "--"}
	}
	c.data = filepath.Join(dir, "data")
	// A port outside the ephemeral range, so it is still free after restart.
	c.port = testport.Reserve(t)
	c.run("initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "--no-sync")
	c.start()
	t.Cleanup(func() { c.pgctl("stop", "-m", "immediate") })
	return c
}

func (c *cluster) run(name string, args ...string) {
	c.t.Helper()
	argv := append(append(append([]string{}, c.as...), filepath.Join(c.bin, name)), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func (c *cluster) pgctl(args ...string) {
	c.t.Helper()
	c.run("pg_ctl", append([]string{"-D", c.data, "-w", "-t", "60"}, args...)...)
}

func (c *cluster) start() {
	c.pgctl("start", "-l", filepath.Join(filepath.Dir(c.data), "server.log"),
		"-o", fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c max_connections=100", c.port, filepath.Dir(c.data)))
}

// restart stops the server (fast: connections are cut), waits, starts it.
func (c *cluster) restart(down time.Duration) {
	c.pgctl("stop", "-m", "fast")
	time.Sleep(down)
	c.start()
}

func (c *cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

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
