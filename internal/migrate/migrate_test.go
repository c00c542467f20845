package migrate_test

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/pgtest"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) == 0 || migs[0].Version != 1 || migs[0].Name != "outbox" {
		t.Fatalf("migrations = %+v", migs)
	}
	bad := []fstest.MapFS{
		{"m/0001_a.up.sql": {Data: []byte("x")}},                                           // no down
		{"m/1_a.up.sql": {Data: []byte("x")}},                                              // bad name
		{"m/0001_a.up.sql": {Data: []byte("x")}, "m/0001_b.down.sql": {Data: []byte("x")}}, // two names
	}
	for i, fsys := range bad {
		if _, err := migrate.Load(fsys, "m"); err == nil {
			t.Errorf("bad set %d loaded without error", i)
		}
	}
}

func TestUpIsIdempotentAndConcurrentSafe(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	// Four migrators at once: each migration is applied exactly once, and
	// none fails on another's work.
	var wg sync.WaitGroup
	applied := make([][]int, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			applied[i], errs[i] = migrate.Up(ctx, conn, migs)
		}()
	}
	wg.Wait()
	total := 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	if total != len(migs) {
		t.Fatalf("%d migrations applied in all, want %d", total, len(migs))
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	again, err := migrate.Up(ctx, conn, migs)
	if err != nil || len(again) != 0 {
		t.Fatalf("second run applied %v, %v", again, err)
	}
	// Down then up again: the down files really undo the up files.
	if v, err := migrate.Down(ctx, conn, migs, len(migs)); err != nil || len(v) != len(migs) {
		t.Fatalf("down: %v, %v", v, err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('sms_outbox') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("sms_outbox exists after down: %v %v", exists, err)
	}
	if v, err := migrate.Up(ctx, conn, migs); err != nil || len(v) != len(migs) {
		t.Fatalf("up after down: %v, %v", v, err)
	}
}

func TestEnsureDatabaseCreatesMissing(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t) // reserves a name and drops it at the end
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	cfg, _ := pgx.ParseConfig(url)
	if _, err := admin.Exec(ctx, "DROP DATABASE "+cfg.Database); err != nil {
		t.Fatal(err)
	}
	conn, created, err := migrate.EnsureDatabase(ctx, url)
	if err != nil || !created {
		t.Fatalf("EnsureDatabase = %v, %v; want created", created, err)
	}
	conn.Close(ctx)
	conn, created, err = migrate.EnsureDatabase(ctx, url)
	if err != nil || created {
		t.Fatalf("second EnsureDatabase = %v, %v; want existing", created, err)
	}
	conn.Close(ctx)
}
