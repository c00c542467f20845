// Package pgtest gives tests a fresh, migrated Postgres database of their own
// on a real server: TEST_DATABASE_URL when set, else the local service.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
)

// DefaultURL is the local service used when TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// AdminURL returns the URL of the server's maintenance database that tests
// create their databases through.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Host returns the host:port of the server AdminURL reaches.
func Host() string {
	cfg, err := pgx.ParseConfig(AdminURL())
	if err != nil {
		return "127.0.0.1:5432"
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// Create creates an empty database with a random name and returns its URL
// and a function that drops it.
func Create(ctx context.Context) (string, func() error, error) {
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return "", nil, fmt.Errorf("pgtest: connect to %s (set TEST_DATABASE_URL): %w", redactURL(AdminURL()), err)
	}
	defer admin.Close(ctx)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "sendonce_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("pgtest: create database: %w", err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			return fmt.Errorf("pgtest: connect to drop %s: %w", name, err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("pgtest: drop %s: %w", name, err)
		}
		return nil
	}
	return WithDatabase(AdminURL(), name), drop, nil
}

// Migrate applies every migration to the database at url.
func Migrate(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		return fmt.Errorf("pgtest: load migrations: %w", err)
	}
	if _, err := migrate.Up(ctx, conn, migs); err != nil {
		return fmt.Errorf("pgtest: migrate: %w", err)
	}
	return nil
}

// NewDatabase creates an empty database for this test, drops it when the
// test ends, and returns its URL. The test fails at once if Postgres is
// unreachable: integration tests never skip silently.
func NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, drop, err := Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Error(err)
		}
	})
	return url
}

// NewMigrated is NewDatabase with every migration applied.
func NewMigrated(t testing.TB) string {
	t.Helper()
	url := NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	return url
}

// NewMigratedForMain is NewMigrated for TestMain, where no test exists yet;
// it panics on failure and returns the drop function to call after m.Run.
func NewMigratedForMain() (string, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, drop, err := Create(ctx)
	if err != nil {
		panic(err)
	}
	if err := Migrate(ctx, url); err != nil {
		_ = drop()
		panic(err)
	}
	return url, func() { _ = drop() }
}

// NewPool is NewMigrated plus a pool on it, closed when the test ends.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	url := NewMigrated(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, url
}

// WithDatabase returns dsn (a URL or a keyword/value string) naming database
// name instead of its own.
func WithDatabase(dsn, name string) string {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return dsn + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

func redactURL(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return "the test database"
	}
	return u.Redacted()
}

// LoadRows empties the outbox of pool's database and loads n rows with
// status (pending, queued, sending) in one COPY, then analyzes the table, as
// the benchmarks need; it returns the ids in load order.
func LoadRows(tb testing.TB, pool *pgxpool.Pool, n int, status string) []uuid.UUID {
	tb.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `TRUNCATE sms_evidence, sms_attempts, sms_outbox`); err != nil {
		tb.Fatal(err)
	}
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		i++
		return []any{ids[i-1], fmt.Sprintf("+1555%07d", i), "Your bench code is 482901. It expires in 10 minutes.", status}, nil
	})
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"sms_outbox"}, []string{"id", "to_e164", "body", "status"}, src); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		tb.Fatal(err)
	}
	return ids
}

// AsRole returns the URL dsn with every connection acting as role (a
// least-privilege role of the migrations), as a login role that is a member
// of it would.
func AsRole(tb testing.TB, dsn, role string) string {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("pgtest: %s is not a URL", redactURL(dsn))
	}
	// Spaces as %20: the driver does not read "+" as a space here.
	if u.RawQuery != "" {
		u.RawQuery += "&"
	}
	u.RawQuery += "options=-c%20role%3D" + role
	return u.String()
}

// Explain returns the plan Postgres makes for sql with args on q, from
// EXPLAIN (COSTS OFF), one line per plan line.
func Explain(tb testing.TB, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args ...any) string {
	tb.Helper()
	rows, err := q.Query(context.Background(), `EXPLAIN (COSTS OFF) `+sql, args...)
	if err != nil {
		tb.Fatalf("pgtest: explain: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatalf("pgtest: explain: %v", err)
	}
	return strings.Join(lines, "\n") + "\n"
}
