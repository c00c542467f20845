package relay_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// BenchmarkRetentionDeleteVsPartitionDrop measures what retention costs on a
// large table, two ways, on the same data: SENDONCE_RETENTION_BENCH_ROWS
// finished rows (default 10,000,000; one attempt each) spread over 10 days,
// of which the oldest day is retired.
//
//   - delete: today's Retention.Purge (DELETE in batches of 1,000, attempts
//     by cascade), then the VACUUM the dead rows need;
//   - partition drop: the same rows in tables partitioned by day
//     (docs/operations.md, "Partitioning"), the oldest partition of each
//     detached CONCURRENTLY and dropped.
//
// It reports wall time and WAL written for each. Run it with
// `make bench-retention` (not part of make test: loading the rows takes
// minutes).
func BenchmarkRetentionDeleteVsPartitionDrop(b *testing.B) {
	rows := 10_000_000
	if s := os.Getenv("SENDONCE_RETENTION_BENCH_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 10 {
			b.Fatalf("SENDONCE_RETENTION_BENCH_ROWS=%q: want a number of rows >= 10", s)
		}
		rows = n
	}
	const days = 10
	perDay := rows / days
	ctx := context.Background()
	pool, _ := pgtest.NewPool(b)
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	wal := func() string {
		var lsn string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
			b.Fatal(err)
		}
		return lsn
	}
	walSince := func(from string) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, from).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	// Day d (0 the oldest) holds rows i in [d*perDay, (d+1)*perDay), created
	// and finished during the calendar day that began 10 - d midnights ago.
	load := func(outbox, attempts string, withCreated bool) time.Duration {
		start := time.Now()
		for d := range days {
			lo, hi := d*perDay+1, (d+1)*perDay
			at := fmt.Sprintf("date_trunc('day', now()) - interval '%d days' + (i %% 86400) * interval '1 second'", days-d)
			exec(fmt.Sprintf(`INSERT INTO %s (id, to_e164, body, status, created_at, updated_at, finished_at)
				SELECT lpad(to_hex(i), 32, '0')::uuid, '+1555' || lpad((i %% 10000000)::text, 7, '0'),
				       'Your code is ' || lpad((i %% 1000000)::text, 6, '0'), 'sent', %s, %s, %s
				FROM generate_series(%d, %d) AS i`, outbox, at, at, at, lo, hi))
			cols, vals := "outbox_id, attempt, started_at, outcome", "lpad(to_hex(i), 32, '0')::uuid, 1, "+at+", 'sent'"
			if withCreated {
				cols, vals = "outbox_created_at, "+cols, at+", "+vals
			}
			exec(fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM generate_series(%d, %d) AS i`, attempts, cols, vals, lo, hi))
		}
		exec(`ANALYZE ` + outbox)
		exec(`ANALYZE ` + attempts)
		return time.Since(start)
	}

	for range b.N {
		// --- DELETE-based purge, as shipped.
		exec(`TRUNCATE sms_evidence, sms_attempts, sms_outbox`)
		took := load("sms_outbox", "sms_attempts", false)
		b.Logf("delete: %d rows and %d attempts loaded in %s", rows, rows, took.Round(time.Second))
		// Exactly the oldest day is older than this.
		var ageSecs float64
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT extract(epoch FROM now() - (date_trunc('day', now()) - interval '%d days'))`, days-1)).Scan(&ageSecs); err != nil {
			b.Fatal(err)
		}
		ret, err := relay.NewRetention(relay.RetentionConfig{
			Pool: pool, Age: time.Duration(ageSecs * float64(time.Second)), Pause: time.Nanosecond, DBTimeout: time.Minute,
		})
		if err != nil {
			b.Fatal(err)
		}
		from, start := wal(), time.Now()
		purged, err := ret.Purge(ctx)
		if err != nil {
			b.Fatal(err)
		}
		purgeTook, purgeWAL := time.Since(start), walSince(from)
		from, start = wal(), time.Now()
		exec(`VACUUM sms_outbox`)
		exec(`VACUUM sms_attempts`)
		vacuumTook, vacuumWAL := time.Since(start), walSince(from)
		b.Logf("delete: purged %d rows (one day of %d) in %s, %s of WAL, leaving %d dead row versions (each row and its attempt); the VACUUM of both tables after it took %s and %s of WAL",
			purged, days, purgeTook.Round(time.Millisecond), mib(purgeWAL), 2*purged, vacuumTook.Round(time.Millisecond), mib(vacuumWAL))
		exec(`TRUNCATE sms_evidence, sms_attempts, sms_outbox`)

		// --- The same rows in daily partitions; retire the oldest by
		// dropping its partitions.
		partitioned(b, pool, days)
		took = load("sms_outbox_p", "sms_attempts_p", true)
		b.Logf("partition drop: %d rows and %d attempts loaded in %s", rows, rows, took.Round(time.Second))
		from, start = wal(), time.Now()
		exec(`ALTER TABLE sms_attempts_p DETACH PARTITION sms_attempts_p_d0 CONCURRENTLY`)
		exec(`DROP TABLE sms_attempts_p_d0`)
		exec(`ALTER TABLE sms_outbox_p DETACH PARTITION sms_outbox_p_d0 CONCURRENTLY`)
		exec(`DROP TABLE sms_outbox_p_d0`)
		dropTook, dropWAL := time.Since(start), walSince(from)
		b.Logf("partition drop: retired one day (%d rows and their attempts) in %s, %s of WAL, no dead rows, no VACUUM",
			perDay, dropTook.Round(time.Millisecond), mib(dropWAL))
		exec(`DROP TABLE sms_attempts_p, sms_outbox_p`)

		b.ReportMetric(purgeTook.Seconds(), "delete-s")
		b.ReportMetric(vacuumTook.Seconds(), "vacuum-s")
		b.ReportMetric(float64(purgeWAL+vacuumWAL)/(1<<20), "delete-WAL-MiB")
		b.ReportMetric(dropTook.Seconds(), "drop-s")
		b.ReportMetric(float64(dropWAL)/(1<<20), "drop-WAL-MiB")
	}
}

// partitioned creates sms_outbox_p and sms_attempts_p: the outbox's
// columns and indexes, range-partitioned by day on created_at (immutable,
// set at insert), with one partition per day d0 (oldest) .. d<days-1>, and
// the attempts partitioned on the same day through outbox_created_at. The
// primary key must hold the partition key, so it is (id, created_at).
func partitioned(b *testing.B, pool *pgxpool.Pool, days int) {
	b.Helper()
	ctx := context.Background()
	stmts := []string{
		`CREATE TABLE sms_outbox_p (LIKE sms_outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (created_at)`,
		`ALTER TABLE sms_outbox_p ADD PRIMARY KEY (id, created_at)`,
		`CREATE INDEX ON sms_outbox_p (created_at) WHERE status = 'pending'`,
		`CREATE INDEX ON sms_outbox_p (updated_at) WHERE status IN ('queued', 'sending')`,
		`CREATE INDEX ON sms_outbox_p (updated_at) WHERE status IN ('sent', 'dead', 'unknown')`,
		`CREATE TABLE sms_attempts_p (
			id bigint GENERATED ALWAYS AS IDENTITY, outbox_id uuid NOT NULL, outbox_created_at timestamptz NOT NULL,
			attempt integer NOT NULL, started_at timestamptz NOT NULL, latency_ms double precision,
			outcome text NOT NULL, http_status integer, provider_code integer, error text, sender text,
			PRIMARY KEY (id, outbox_created_at),
			FOREIGN KEY (outbox_id, outbox_created_at) REFERENCES sms_outbox_p (id, created_at) ON DELETE CASCADE
		) PARTITION BY RANGE (outbox_created_at)`,
		`CREATE INDEX ON sms_attempts_p (outbox_id, id)`,
	}
	for d := range days {
		lo := fmt.Sprintf("date_trunc('day', now()) - interval '%d days'", days-d)
		hi := fmt.Sprintf("date_trunc('day', now()) - interval '%d days'", days-d-1)
		if d == 0 {
			lo = "MINVALUE"
		}
		if d == days-1 {
			hi = "MAXVALUE"
		}
		stmts = append(stmts,
			fmt.Sprintf(`CREATE TABLE sms_outbox_p_d%d PARTITION OF sms_outbox_p FOR VALUES FROM (%s) TO (%s)`, d, lo, hi),
			fmt.Sprintf(`CREATE TABLE sms_attempts_p_d%d PARTITION OF sms_attempts_p FOR VALUES FROM (%s) TO (%s)`, d, lo, hi))
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			b.Fatalf("%s: %v", s, err)
		}
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
