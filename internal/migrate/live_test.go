package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// retryCounter is a slog handler that passes lines to t.Log and counts the
// migrator's lock-timeout retries.
type retryCounter struct {
	t       *testing.T
	retries atomic.Int64
	signal  chan struct{} // receives one value per retry (never blocks)
}

func (h *retryCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *retryCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *retryCounter) WithGroup(string) slog.Handler            { return h }
func (h *retryCounter) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.t.Logf("migrate: %s%s", r.Message, b.String())
	if strings.Contains(r.Message, "gave up waiting for a lock") {
		h.retries.Add(1)
		select {
		case h.signal <- struct{}{}:
		default:
		}
	}
	return nil
}

// A table of 1,000,000 rows is migrated from version 2 to the newest while
// applications keep inserting, and a long transaction holds a lock on the
// table meanwhile (a report, a pg_dump): no insert waits for a lock longer
// than the migrator's lock timeout (plus the instant a catalog change holds
// its lock), because every statement that wants an exclusive lock gives up
// after it and tries again later instead of queueing every writer behind it.
//
// The inserts measure their own lock waits: each runs with lock_timeout set
// to the bound, so Postgres fails any insert that waited longer.
func TestLiveMigrationOfAMillionRows(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table of 1,000,000 rows")
	}
	t.Parallel()
	const (
		rows        = 1_000_000
		lockTimeout = 500 * time.Millisecond
		// A catalog change that got its lock holds it until its commit.
		holdGrace   = 250 * time.Millisecond
		insertBound = lockTimeout + holdGrace
		inserters   = 4
	)
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	conn := connect()
	if _, err := migrate.Up(ctx, conn, migs[:2]); err != nil { // the table as 0001-0002 made it
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO sms_outbox (id, to_e164, body, status, created_at, updated_at)
		SELECT lpad(to_hex(i), 32, '0')::uuid, '+1555' || lpad((i %% 10000000)::text, 7, '0'), 'message number ' || i,
		       CASE WHEN i %% 100 = 0 THEN 'pending' WHEN i %% 100 = 1 THEN 'queued' WHEN i %% 100 = 2 THEN 'dead' ELSE 'sent' END,
		       now() - (i %% 604800) * interval '1 second', now() - (i %% 604800) * interval '1 second'
		FROM generate_series(1, %d) AS i`, rows)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows written in %s", rows, time.Since(start).Round(time.Millisecond))

	// The long transaction: ACCESS SHARE, as any SELECT takes, held until the
	// migrator has given up on its lock twice (or an insert failed).
	h := &retryCounter{t: t, signal: make(chan struct{}, 16)}
	insertFailed := make(chan struct{})
	var failOnce sync.Once
	blocker := connect()
	btx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := btx.Exec(ctx, `LOCK TABLE sms_outbox IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	blockerDone := make(chan error, 1)
	go func() {
		for seen := 0; seen < 2; seen++ {
			select {
			case <-h.signal:
			case <-insertFailed:
				seen = 2
			case <-ctx.Done():
				seen = 2
			}
		}
		blockerDone <- btx.Commit(context.Background())
	}()

	// The applications: single-row inserts in a loop until the migration ends.
	stop := make(chan struct{})
	var (
		wg        sync.WaitGroup
		inserted  atomic.Int64
		longest   atomic.Int64 // nanoseconds, wall time of the slowest insert
		insertErr error
		errMu     sync.Mutex
	)
	for range inserters {
		c := connect()
		if _, err := c.Exec(ctx, fmt.Sprintf(`SET lock_timeout = '%dms'`, insertBound.Milliseconds())); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				_, err := c.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body) VALUES (gen_random_uuid(), '+15550001111', 'during the migration')`)
				d := int64(time.Since(t0))
				for {
					old := longest.Load()
					if d <= old || longest.CompareAndSwap(old, d) {
						break
					}
				}
				if err != nil {
					errMu.Lock()
					if insertErr == nil {
						insertErr = err
					}
					errMu.Unlock()
					failOnce.Do(func() { close(insertFailed) })
					return
				}
				inserted.Add(1)
			}
		})
	}

	m, err := migrate.New(migrate.Config{LockTimeout: lockTimeout, RetryWait: 100 * time.Millisecond, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	applied, err := m.Up(ctx, connect(), migs)
	took := time.Since(start)
	close(stop)
	wg.Wait()
	if berr := <-blockerDone; berr != nil {
		t.Fatal(berr)
	}
	if err != nil {
		t.Fatalf("migration: %v", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(insertErr, &pgErr) && pgErr.Code == "55P03" {
		t.Fatalf("an insert waited longer than %s for a lock: %v", insertBound, insertErr)
	}
	if insertErr != nil {
		t.Fatalf("an insert failed: %v", insertErr)
	}
	if len(applied) != len(migs)-2 {
		t.Fatalf("applied %v, want every version after 2", applied)
	}
	// The scenario happened: the long transaction made the migrator give
	// up at least once while the inserts went on.
	if h.retries.Load() < 1 || inserted.Load() == 0 {
		t.Fatalf("retries %d, inserts %d: the test did not exercise a blocked migration", h.retries.Load(), inserted.Load())
	}
	var indexValid, checkValid bool
	if err := conn.QueryRow(ctx, `SELECT
		(SELECT bool_and(indisvalid) FROM pg_index WHERE indrelid = 'sms_outbox'::regclass),
		(SELECT convalidated FROM pg_constraint WHERE conname = 'sms_outbox_dead_never_maybe_accepted')`).Scan(&indexValid, &checkValid); err != nil {
		t.Fatal(err)
	}
	if !indexValid || !checkValid {
		t.Fatalf("every index valid %v, dead/maybe_accepted check validated %v", indexValid, checkValid)
	}
	t.Logf("migrated %d rows from version 2 to %d in %s (%d lock-timeout retries) while %d inserts ran; longest insert %s (bound on its lock wait %s)",
		rows, migrate.Latest(migs), took.Round(time.Millisecond), h.retries.Load(), inserted.Load(),
		time.Duration(longest.Load()).Round(time.Millisecond), insertBound)
}
