package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
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

func containsWord(s, word string) bool {
	for _, f := range strings.Fields(strings.ToUpper(s)) {
		if f == word {
			return true
		}
	}
	return false
}

// A down migration on a table that holds rows is refused unless forced:
// roll back the binaries, not the schema.
func TestDownRefusesATableWithRowsUnlessForced(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body) VALUES (gen_random_uuid(), '+15551234567', 'keep me')`); err != nil {
		t.Fatal(err)
	}
	v, err := migrate.Down(ctx, conn, migs, 1)
	if !errors.Is(err, migrate.ErrNotEmpty) || len(v) != 0 || !strings.Contains(err.Error(), "-force") {
		t.Fatalf("Down on a table with rows = %v, %v; want ErrNotEmpty naming -force", v, err)
	}
	found, err := migrate.CheckVersion(ctx, conn, migrate.Latest(migs))
	if err != nil || found != migrate.Latest(migs) {
		t.Fatalf("after a refused down the schema is at %d (%v), want %d", found, err, migrate.Latest(migs))
	}
	m, err := migrate.New(migrate.Config{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Down(ctx, conn, migs, 1); err != nil || len(v) != 1 || v[0] != migrate.Latest(migs) {
		t.Fatalf("forced Down = %v, %v", v, err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM sms_outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after forcing the newest down: %d, %v", n, err)
	}
}

// CheckVersion says which version it found and which it needs, and accepts
// a newer schema (old binaries run on it during a rolling upgrade).
func TestCheckVersion(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	latest := migrate.Latest(migs)
	if _, err := migrate.CheckVersion(ctx, conn, latest); !errors.Is(err, migrate.ErrSchemaTooOld) || !strings.Contains(err.Error(), "version 0") {
		t.Fatalf("empty database: %v", err)
	}
	if _, err := migrate.Up(ctx, conn, migs[:5]); err != nil {
		t.Fatal(err)
	}
	found, err := migrate.CheckVersion(ctx, conn, latest)
	if !errors.Is(err, migrate.ErrSchemaTooOld) || found != 5 {
		t.Fatalf("at version 5: found %d, %v", found, err)
	}
	for _, want := range []string{"found version 5", fmt.Sprintf("need version %d", latest), "relay migrate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if found, err := migrate.CheckVersion(ctx, conn, 4); err != nil || found != 5 {
		t.Fatalf("a newer schema than needed: %d, %v", found, err)
	}
	if _, err := migrate.Up(ctx, conn, migs); err != nil {
		t.Fatal(err)
	}
	// Each component's role can read the version (granted by 0009).
	for _, role := range []string{"sendonce_app", "sendonce_relay", "sendonce_sender"} {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
				return err
			}
			_, err := migrate.CheckVersion(ctx, tx, latest)
			return err
		})
		if err != nil {
			t.Errorf("as %s: %v", role, err)
		}
	}
}

// The database refuses "dead" for a row an attempt may have reached the
// provider with (an old sender racing a new one), and 0009 turns such rows
// left by an older release into unknown before it validates the rule.
func TestDeadNeverMaybeAccepted(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	var before []migrate.Migration
	for _, m := range migs {
		if m.Version < 9 {
			before = append(before, m)
		}
	}
	if _, err := migrate.Up(ctx, conn, before); err != nil {
		t.Fatal(err)
	}
	var liar string
	if err := conn.QueryRow(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, maybe_accepted)
		VALUES (gen_random_uuid(), '+15551234567', 'x', 'dead', true) RETURNING id::text`).Scan(&liar); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, conn, migs); err != nil {
		t.Fatal(err)
	}
	var status string
	if err := conn.QueryRow(ctx, `SELECT status FROM sms_outbox WHERE id = $1`, liar).Scan(&status); err != nil || status != "unknown" {
		t.Fatalf("a dead, maybe accepted row from before 0009 is %q (%v), want unknown", status, err)
	}
	_, err = conn.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body) VALUES (gen_random_uuid(), '+15551234567', 'y')`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `UPDATE sms_outbox SET maybe_accepted = true WHERE body = 'y'`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `UPDATE sms_outbox SET status = 'dead' WHERE body = 'y'`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "sms_outbox_dead_never_maybe_accepted" {
		t.Fatalf("dead over maybe_accepted: %v; want a check violation", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE sms_outbox SET status = 'unknown' WHERE body = 'y'`); err != nil {
		t.Fatalf("unknown over maybe_accepted: %v", err)
	}
}

// A schema at the newest version without an older migration (0010, added
// after 0011 was released) is too old for the binary, and migrate applies
// the missing one.
func TestCheckEmbeddedFindsAMissingOlderMigration(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	var without []migrate.Migration
	for _, m := range migs {
		if m.Version != 10 {
			without = append(without, m)
		}
	}
	if _, err := migrate.Up(ctx, conn, without); err != nil {
		t.Fatal(err)
	}
	_, _, err = migrate.CheckEmbedded(ctx, conn)
	if !errors.Is(err, migrate.ErrSchemaTooOld) || !strings.Contains(err.Error(), "without migration 10") {
		t.Fatalf("CheckEmbedded without 0010: %v", err)
	}
	if applied, err := migrate.Up(ctx, conn, migs); err != nil || len(applied) != 1 || applied[0] != 10 {
		t.Fatalf("Up applied %v, %v; want [10]", applied, err)
	}
	if _, _, err := migrate.CheckEmbedded(ctx, conn); err != nil {
		t.Fatalf("CheckEmbedded after migrate: %v", err)
	}
}

// A schema where roles other than its owner may create (PUBLIC, as on a
// database upgraded from Postgres 14 or earlier, or a component's role)
// lets them plant functions and operators in the path of the functions
// that run with the table owner's rights: migrate refuses it, naming the
// statement that closes it, before it applies anything, and on every run.
func TestUpRefusesASchemaOthersMayCreateIn(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`GRANT CREATE ON SCHEMA public TO PUBLIC`)
	applied, err := migrate.Up(ctx, conn, migs)
	if !errors.Is(err, migrate.ErrSchemaOpen) || !strings.Contains(err.Error(), "REVOKE CREATE ON SCHEMA public FROM PUBLIC") || len(applied) != 0 {
		t.Fatalf("Up over a schema PUBLIC may create in: applied %v, %v; want ErrSchemaOpen naming REVOKE CREATE ON SCHEMA public FROM PUBLIC", applied, err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('sms_outbox') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("sms_outbox exists (%v) after a refused migration", err)
	}
	exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	if _, err := migrate.Up(ctx, conn, migs); err != nil {
		t.Fatal(err)
	}
	// A role of its own, not the owner, granted CREATE later: the next run
	// refuses as well, naming it.
	role := fmt.Sprintf("sendonce_creator_%d", time.Now().UnixNano())
	exec(`CREATE ROLE ` + role + ` NOLOGIN`)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err == nil {
			_, _ = c.Exec(context.Background(), `REVOKE ALL ON SCHEMA public FROM `+role)
			c.Close(context.Background())
		}
		if a, err := pgx.Connect(context.Background(), pgtest.AdminURL()); err == nil {
			_, _ = a.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
			a.Close(context.Background())
		}
	})
	exec(`GRANT CREATE ON SCHEMA public TO ` + role)
	if _, err := migrate.Up(ctx, conn, migs); !errors.Is(err, migrate.ErrSchemaOpen) ||
		!strings.Contains(err.Error(), "REVOKE CREATE ON SCHEMA public FROM "+role) {
		t.Fatalf("Up with CREATE granted to %s: %v; want ErrSchemaOpen naming the REVOKE", role, err)
	}
	exec(`REVOKE CREATE ON SCHEMA public FROM ` + role)
	if _, err := migrate.Up(ctx, conn, migs); err != nil {
		t.Fatal(err)
	}
}
