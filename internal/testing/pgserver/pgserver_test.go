package pgserver_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/testing/pgserver"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// A primary, a streaming standby made with BaseBackup, the primary crashed,
// the standby promoted: a multi-host DSN with target_session_attrs finds the
// writable one before and after.
func TestStandbyPromotion(t *testing.T) {
	t.Parallel()
	bin, err := pgserver.FindBin()
	if err != nil {
		t.Skip(err) // no server binaries on this machine
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := pgserver.NewDir("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	primary, err := pgserver.Init(ctx, bin, dir, "primary", testport.Reserve(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.StopQuietly)
	exec(t, primary.URL("postgres"), `CREATE TABLE t (n int)`)
	standby, err := pgserver.BaseBackup(ctx, bin, "127.0.0.1", primary.Port, dir, "standby", testport.Reserve(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.StopQuietly)
	dsn := "postgres://postgres@" + primary.Addr() + "," + standby.Addr() + "/postgres?sslmode=disable&target_session_attrs=read-write"
	exec(t, dsn, `INSERT INTO t VALUES (1)`)
	waitRows(t, standby.URL("postgres"), 1)

	if err := primary.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, dsn, `INSERT INTO t VALUES (2)`)
	waitRows(t, standby.URL("postgres"), 2)
}

func exec(t *testing.T, dsn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

func waitRows(t *testing.T, dsn string, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var n int
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n)
			conn.Close(ctx)
		}
		cancel()
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows (%v), want %d", n, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
