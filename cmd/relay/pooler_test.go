package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/testing/pgbouncer"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// Managed Postgres: the database's owner is no superuser and may not
// create roles; an administrator created the roles once. relay migrate
// applies every migration as that owner.
func TestMigrateAsAnOwnerThatIsNoSuperuser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	suffix := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	owner, db := "sendonce_owner_"+suffix, "sendonce_managed_"+suffix
	// The administrator's part (docs/operations.md, managed Postgres).
	for _, sql := range []string{
		`DO $$ DECLARE r text; BEGIN
			FOREACH r IN ARRAY ARRAY['sendonce_app', 'sendonce_relay', 'sendonce_sender', 'sendonce_receiver', 'sendonce_console'] LOOP
				IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
					BEGIN EXECUTE format('CREATE ROLE %I NOLOGIN', r); EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END;
				END IF;
			END LOOP; END $$`,
		fmt.Sprintf(`CREATE ROLE %s LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB`, owner),
		fmt.Sprintf(`CREATE DATABASE %s OWNER %s`, db, owner),
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, db))
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP ROLE IF EXISTS %s`, owner))
	})
	u, err := url.Parse(pgtest.WithDatabase(pgtest.AdminURL(), db))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(owner)
	var out, errOut testkit.Buffer
	if code := run(ctx, []string{"relay", "migrate"}, testkit.EnvMap(map[string]string{"DATABASE_URL": u.String()}), &out, &errOut); code != 0 {
		t.Fatalf("migrate as %s: exit %d: %s", owner, code, errOut.String())
	}
}

// Behind a transaction pooler: relay migrate refuses to run without a
// direct connection, naming the setting; without DATABASE_POOLER, a start
// through PgBouncer says which setting to set, rather than a pooler's
// words alone.
func TestPoolerSettingsAreNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := pgtest.NewMigrated(t)
	b := pgbouncer.ForTest(t, pgbouncer.Config{Mode: pgbouncer.Transaction, PoolSize: 2})
	pooled := b.Pooled(t, direct)

	var out, errOut testkit.Buffer
	env := map[string]string{"DATABASE_URL": pooled, "DATABASE_POOLER": "transaction"}
	if code := run(ctx, []string{"relay", "migrate"}, testkit.EnvMap(env), &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "DATABASE_DIRECT_URL") {
		t.Fatalf("migrate through a transaction pooler: exit %d, stderr %q; want a refusal naming DATABASE_DIRECT_URL", code, errOut.String())
	}
	env["DATABASE_DIRECT_URL"] = direct
	errOut = testkit.Buffer{}
	if code := run(ctx, []string{"relay", "migrate"}, testkit.EnvMap(env), &out, &errOut); code != 0 {
		t.Fatalf("migrate with DATABASE_DIRECT_URL: exit %d: %s", code, errOut.String())
	}

	errOut = testkit.Buffer{}
	env = map[string]string{"DATABASE_URL": pooled, "HTTP_ADDR": "127.0.0.1:0"}
	if code := run(ctx, []string{"relay"}, testkit.EnvMap(env), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "DATABASE_POOLER") {
		t.Fatalf("relay through PgBouncer without DATABASE_POOLER: exit %d, stderr %q; want the setting named", code, errOut.String())
	}
}

// A pooler told to drop the startup parameter it would refuse
// (ignore_startup_parameters) lets the processes connect as if directly,
// and named prepared statements fail at random later: the start is refused
// instead, naming DATABASE_POOLER.
func TestAPoolerThatDropsStartupParametersIsNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := pgtest.NewMigrated(t)
	b := pgbouncer.ForTest(t, pgbouncer.Config{Mode: pgbouncer.Transaction, PoolSize: 2,
		IgnoreStartupParameters: []string{"plan_cache_mode"}})
	var out, errOut testkit.Buffer
	env := map[string]string{"DATABASE_URL": b.Pooled(t, direct), "HTTP_ADDR": "127.0.0.1:0"}
	if code := run(ctx, []string{"relay"}, testkit.EnvMap(env), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "DATABASE_POOLER") {
		t.Fatalf("exit %d, stderr %q; want the start refused naming DATABASE_POOLER", code, errOut.String())
	}
}
