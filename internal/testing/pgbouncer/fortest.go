package pgbouncer

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// ForTest starts a PgBouncer in front of the tests' Postgres server for t,
// stopped when t ends. Upstream defaults to that server and Port to a free
// one; a machine without pgbouncer skips t, saying how to install it,
// except under CI (CI set), whose .ci/run installs it.
func ForTest(t testing.TB, cfg Config) *Bouncer {
	t.Helper()
	if _, err := Bin(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%v (.ci/run installs it: CI never skips the pooler tests)", err)
		}
		t.Skip(err)
	}
	if cfg.Upstream == "" {
		cfg.Upstream = pgtest.Host()
	}
	if cfg.Port == 0 {
		port, err := testport.Pick()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Port = port
	}
	b, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// Pooled returns dsn's database reached through b as postgres.
func (b *Bouncer) Pooled(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return b.URL("postgres", strings.TrimPrefix(u.Path, "/"))
}
