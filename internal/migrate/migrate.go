// Package migrate applies the embedded SQL migrations to a Postgres database
// that may be large and busy.
//
// Migrations are files NNNN_name.up.sql and NNNN_name.down.sql. Each file
// runs in its own transaction together with the row that records it in
// sendonce_schema_migrations, so a failed migration leaves nothing half done;
// a file whose first line is "-- sendonce:no-transaction" runs one statement
// at a time outside a transaction instead (CREATE INDEX CONCURRENTLY needs
// that) and must be safe to run again from its start.
//
// Every statement waits at most Config.LockTimeout for a table lock: a
// statement that wants an exclusive lock queues ahead of the applications'
// inserts, so a long wait behind a long transaction would stall them all.
// A migration that gave up is tried again after a pause that lets the
// queued writers through.
//
// A session-level advisory lock serialises concurrent runs: two `relay
// migrate` started at once apply each migration exactly once.
package migrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce/internal/backoff"
)

// lockKey is an arbitrary constant naming sendonce's migration lock
// (pg_advisory_lock takes a bigint).
const lockKey = 0x73656e646f6e6365 // "sendonce"

var fileRE = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// Migration is one numbered schema change.
type Migration struct {
	// Version is the number in the file name.
	Version int
	// Name is the rest of the file name, without the direction.
	Name string
	// Up and Down are the SQL texts.
	Up, Down string
}

// Load reads the migrations in dir of fsys, ordered by version. Every version
// needs both an up and a down file, and versions must be unique.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q: want NNNN_name.up.sql or NNNN_name.down.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		}
		if mig.Name != m[2] {
			return nil, fmt.Errorf("migration %04d has two names: %q and %q", v, mig.Name, m[2])
		}
		if m[3] == "up" {
			mig.Up = string(b)
		} else {
			mig.Down = string(b)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("migration %04d_%s needs both an up and a down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Config configures a Migrator. The zero value is the default.
type Config struct {
	// LockTimeout bounds how long one statement waits for a lock on a table
	// (Postgres's lock_timeout). A statement that wants an exclusive lock
	// queues ahead of every later insert, so this is also the longest an
	// application's INSERT waits behind a migration. Statements that build
	// or drop an index CONCURRENTLY (they never block writes) wait as long
	// as they need. Default 2s.
	LockTimeout time.Duration
	// LockRetries is how many more times a migration is tried after a
	// statement of it gave up waiting for a lock; default 30.
	LockRetries int
	// RetryWait is the base of the full-jitter pause between two tries of a
	// migration, U(0, min(30s, RetryWait*2^try)); default 1s.
	RetryWait time.Duration
	// Force lets Down run while sms_outbox holds rows. Without it Down
	// refuses: a down migration drops columns, tables or grants that running
	// processes and unfinished messages need (roll back binaries, not
	// schema).
	Force bool
	// Logger receives a line per migration applied and per retry; default
	// slog.Default().
	Logger *slog.Logger
}

// DefaultLockTimeout is Config.LockTimeout's default, also the default of
// `relay migrate -lock-timeout`.
const DefaultLockTimeout = 2 * time.Second

func (c *Config) setDefaults() {
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultLockTimeout)
	c.LockRetries = cmp.Or(c.LockRetries, 30)
	c.RetryWait = cmp.Or(c.RetryWait, time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *Config) validate() error {
	switch {
	case c.LockTimeout < time.Millisecond:
		return fmt.Errorf("migrate: LockTimeout %s is below 1ms", c.LockTimeout)
	case c.LockRetries < 0:
		return fmt.Errorf("migrate: LockRetries %d is negative", c.LockRetries)
	case c.RetryWait <= 0:
		return fmt.Errorf("migrate: RetryWait %s must be positive", c.RetryWait)
	}
	return nil
}

// Migrator applies and reverts migrations.
type Migrator struct {
	cfg Config
	log *slog.Logger
}

// New returns a Migrator, or an error naming the bad setting.
func New(cfg Config) (*Migrator, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Migrator{cfg: cfg, log: cfg.Logger.With("component", "migrate")}, nil
}

// Up applies every migration not yet recorded, with the default Config
// and no logs (tests migrate their databases with it).
func Up(ctx context.Context, conn *pgx.Conn, migrations []Migration) ([]int, error) {
	m, _ := New(Config{Logger: quiet})
	return m.Up(ctx, conn, migrations)
}

// Down reverts the newest steps migrations, with the default Config (it
// refuses a table that holds rows) and no logs.
func Down(ctx context.Context, conn *pgx.Conn, migrations []Migration, steps int) ([]int, error) {
	m, _ := New(Config{Logger: quiet})
	return m.Down(ctx, conn, migrations, steps)
}

var quiet = slog.New(slog.DiscardHandler)

// Up applies every migration not yet recorded in the database, in order, and
// returns the versions it applied. It refuses (ErrSchemaOpen) a schema in
// which roles other than its owner may create objects, before it applies
// anything and on every run.
func (m *Migrator) Up(ctx context.Context, conn *pgx.Conn, migrations []Migration) ([]int, error) {
	var applied []int
	err := withLock(ctx, conn, func() error {
		if err := checkSchema(ctx, conn); err != nil {
			return err
		}
		done, err := appliedVersions(ctx, conn)
		if err != nil {
			return err
		}
		for _, mig := range migrations {
			if done[mig.Version] {
				continue
			}
			start := time.Now()
			err := m.run(ctx, conn, mig.Up, `INSERT INTO sendonce_schema_migrations (version, name) VALUES ($1, $2)`, mig.Version, mig.Name)
			if err != nil {
				return fmt.Errorf("apply migration %04d_%s: %w", mig.Version, mig.Name, err)
			}
			m.log.InfoContext(ctx, "migration applied", "version", mig.Version, "name", mig.Name, "took", time.Since(start))
			applied = append(applied, mig.Version)
		}
		return nil
	})
	return applied, err
}

// Down reverts the newest steps applied migrations, newest first, and returns
// the versions it reverted. Unless Config.Force is set it refuses (with
// ErrNotEmpty) while sms_outbox holds a row: down migrations drop what
// running binaries and unfinished messages depend on. To undo a release,
// roll back the binaries; the schema stays, since every migration is
// written so that the previous release runs on it.
func (m *Migrator) Down(ctx context.Context, conn *pgx.Conn, migrations []Migration, steps int) ([]int, error) {
	var reverted []int
	err := withLock(ctx, conn, func() error {
		done, err := appliedVersions(ctx, conn)
		if err != nil {
			return err
		}
		for i := len(migrations) - 1; i >= 0 && len(reverted) < steps; i-- {
			mig := migrations[i]
			if !done[mig.Version] {
				continue
			}
			if !m.cfg.Force {
				if err := refuseRows(ctx, conn); err != nil {
					return fmt.Errorf("revert migration %04d_%s: %w", mig.Version, mig.Name, err)
				}
			}
			err := m.run(ctx, conn, mig.Down, `DELETE FROM sendonce_schema_migrations WHERE version = $1`, mig.Version)
			if err != nil {
				return fmt.Errorf("revert migration %04d_%s: %w", mig.Version, mig.Name, err)
			}
			m.log.WarnContext(ctx, "migration reverted", "version", mig.Version, "name", mig.Name)
			reverted = append(reverted, mig.Version)
		}
		return nil
	})
	return reverted, err
}

// openSchemaSQL lists who, besides the owner of the current schema, may
// create in it: PUBLIC, or a role that is neither a superuser nor a member
// of the schema's owner or of the tables' owner (the migrating role until
// sms_outbox exists). A role that may create there can plant a function or
// an operator that matches a call better than the built-in one; the
// functions that run with the table owner's rights name every function
// they call with its schema (migration 0023), and this keeps the schema
// closed besides.
const openSchemaSQL = `
SELECT pg_catalog.quote_ident(n.nspname),
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END
FROM pg_catalog.pg_namespace n
CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) AS a
LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
WHERE n.nspname = pg_catalog.current_schema() AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
  AND (a.grantee = 0 OR NOT (r.rolsuper
       OR pg_catalog.pg_has_role(a.grantee, n.nspowner, 'MEMBER')
       OR pg_catalog.pg_has_role(a.grantee, coalesce(
            (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass('sms_outbox')),
            (SELECT u.oid FROM pg_catalog.pg_roles u WHERE u.rolname = current_user)), 'MEMBER')))
ORDER BY 2`

// checkSchema returns an error wrapping ErrSchemaOpen, naming the REVOKE
// statements that close the schema, when openSchemaSQL finds anyone.
func checkSchema(ctx context.Context, conn *pgx.Conn) error {
	rows, _ := conn.Query(ctx, openSchemaSQL)
	var grantees, revokes []string
	var schema, grantee string
	if _, err := pgx.ForEachRow(rows, []any{&schema, &grantee}, func() error {
		grantees = append(grantees, grantee)
		revokes = append(revokes, "REVOKE CREATE ON SCHEMA "+schema+" FROM "+grantee)
		return nil
	}); err != nil {
		return fmt.Errorf("check who may create in the schema: %w", err)
	}
	if len(revokes) == 0 {
		return nil
	}
	return fmt.Errorf("%w: in schema %s, %s may create functions and operators that sendonce's own functions, which run with the table owner's rights, could be made to call; as the schema's owner run %s; then run relay migrate again (docs/security.md, \"The schema\")",
		ErrSchemaOpen, schema, strings.Join(grantees, ", "), strings.Join(revokes, "; "))
}

// refuseRows returns ErrNotEmpty when sms_outbox exists and holds a row.
func refuseRows(ctx context.Context, conn *pgx.Conn) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('sms_outbox') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("look for sms_outbox: %w", err)
	}
	if !exists {
		return nil
	}
	var rows bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sms_outbox)`).Scan(&rows); err != nil {
		return fmt.Errorf("look for rows in sms_outbox: %w", err)
	}
	if rows {
		return fmt.Errorf("%w: a down migration would destroy data or break running processes; roll back the binaries instead (the schema stays: the previous release runs on it), or pass -force to revert anyway", ErrNotEmpty)
	}
	return nil
}

// run runs script (a migration file) and then the bookkeeping statement
// record with args, trying again after a lock timeout.
func (m *Migrator) run(ctx context.Context, conn *pgx.Conn, script, record string, args ...any) error {
	for try := 0; ; try++ {
		var err error
		if NoTransaction(script) {
			err = m.runEach(ctx, conn, script, record, args)
		} else {
			err = m.runInTx(ctx, conn, script, record, args)
		}
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || try >= m.cfg.LockRetries {
			return err
		}
		// 55P03 lock_not_available: lock_timeout ran out. Let the writers
		// queued behind the statement through, then queue again.
		d := backoff.Full(try, m.cfg.RetryWait, 30*time.Second)
		m.log.WarnContext(ctx, "a migration statement gave up waiting for a lock; trying again",
			"err", err, "lock_timeout", m.cfg.LockTimeout, "try", try+1, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return fmt.Errorf("%w (gave up waiting to retry: %w)", err, ctx.Err())
		}
	}
}

// runInTx runs script and record in one transaction, under lock_timeout.
func (m *Migrator) runInTx(ctx context.Context, conn *pgx.Conn, script, record string, args []any) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, pgInterval(m.cfg.LockTimeout)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, script); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, record, args...)
		return err
	})
}

// runEach runs the statements of script one by one, each in its own
// implicit transaction, and then record. A failure part-way leaves the
// statements before it applied: a no-transaction migration must be safe to
// run again from its start (IF NOT EXISTS, DROP INDEX CONCURRENTLY IF EXISTS
// before a CREATE INDEX CONCURRENTLY whose earlier try left an invalid index).
func (m *Migrator) runEach(ctx context.Context, conn *pgx.Conn, script, record string, args []any) (err error) {
	defer func() {
		if _, rerr := conn.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`); rerr != nil && err == nil {
			err = rerr
		}
	}()
	for _, stmt := range Split(script) {
		timeout := "0"
		if !concurrently(stmt) {
			timeout = pgInterval(m.cfg.LockTimeout)
		}
		if _, err := conn.Exec(ctx, `SELECT set_config('lock_timeout', $1, false)`, timeout); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	_, err = conn.Exec(ctx, record, args...)
	return err
}

// pgInterval writes d as a Postgres duration in milliseconds.
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

func withLock(ctx context.Context, conn *pgx.Conn, fn func() error) (err error) {
	// Polled rather than waited for: a session waiting in pg_advisory_lock
	// holds a snapshot, and a CREATE INDEX CONCURRENTLY run by the holder
	// waits for every older snapshot to go away: a deadlock.
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(lockKey)).Scan(&got); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if got {
			break
		}
		if !backoff.Sleep(ctx, backoff.Jitter(150*time.Millisecond)) {
			return fmt.Errorf("wait for the migration lock (another migration is running): %w", ctx.Err())
		}
	}
	defer func() {
		// A fresh context: the unlock must run even when ctx is done, or the
		// lock lives as long as the connection.
		_, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(lockKey))
		if uerr != nil && err == nil {
			err = fmt.Errorf("release migration lock: %w", uerr)
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS sendonce_schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create migrations table: %w", err)
	}
	return fn()
}

func appliedVersions(ctx context.Context, conn *pgx.Conn) (map[int]bool, error) {
	rows, _ := conn.Query(ctx, `SELECT version FROM sendonce_schema_migrations`)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	done := make(map[int]bool, len(versions))
	for _, v := range versions {
		done[int(v)] = true
	}
	return done, nil
}

// EnsureDatabase connects to dsn and, when the database it names does not
// exist (SQLSTATE 3D000), creates it through the server's maintenance
// database "postgres" first. It returns the open connection and whether it
// created the database.
func EnsureDatabase(ctx context.Context, dsn string) (*pgx.Conn, bool, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		return conn, false, nil
	}
	if _, perr := pgx.ParseConfig(dsn); perr != nil {
		// pgx's parse errors quote dsn, masking the password only where
		// they find it: say no more than that it does not parse.
		return nil, false, errors.New("cannot parse the connection string (left out: it may hold a password)")
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return nil, false, fmt.Errorf("connect: %w", err)
	}
	cfg, perr := pgx.ParseConfig(dsn)
	if perr != nil {
		return nil, false, errors.New("cannot parse the connection string (left out: it may hold a password)")
	}
	name := cfg.Database
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("connect to maintenance database to create %q: %w", name, err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	admin.Close(ctx)
	created := err == nil
	// Another migrator may have created it in the meantime (42P04).
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") {
		return nil, false, fmt.Errorf("create database %q: %w", name, err)
	}
	conn, err = pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, false, fmt.Errorf("connect after creating database: %w", err)
	}
	return conn, created, nil
}
