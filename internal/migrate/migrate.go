// Package migrate applies the embedded SQL migrations to a Postgres database.
//
// Migrations are files NNNN_name.up.sql and NNNN_name.down.sql. Each up file
// runs in its own transaction together with the row that records it in
// sendonce_schema_migrations, so a failed migration leaves nothing half done.
// A session-level advisory lock serialises concurrent runs: two `relay migrate`
// started at once apply each migration exactly once.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Up applies every migration not yet recorded in the database, in order, and
// returns the versions it applied.
func Up(ctx context.Context, conn *pgx.Conn, migrations []Migration) ([]int, error) {
	var applied []int
	err := withLock(ctx, conn, func() error {
		done, err := appliedVersions(ctx, conn)
		if err != nil {
			return err
		}
		for _, m := range migrations {
			if done[m.Version] {
				continue
			}
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, m.Up); err != nil {
					return err
				}
				_, err := tx.Exec(ctx,
					`INSERT INTO sendonce_schema_migrations (version, name) VALUES ($1, $2)`,
					m.Version, m.Name)
				return err
			})
			if err != nil {
				return fmt.Errorf("apply migration %04d_%s: %w", m.Version, m.Name, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	return applied, err
}

// Down reverts the newest steps applied migrations, newest first, and returns
// the versions it reverted.
func Down(ctx context.Context, conn *pgx.Conn, migrations []Migration, steps int) ([]int, error) {
	var reverted []int
	err := withLock(ctx, conn, func() error {
		done, err := appliedVersions(ctx, conn)
		if err != nil {
			return err
		}
		for i := len(migrations) - 1; i >= 0 && len(reverted) < steps; i-- {
			m := migrations[i]
			if !done[m.Version] {
				continue
			}
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, m.Down); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `DELETE FROM sendonce_schema_migrations WHERE version = $1`, m.Version)
				return err
			})
			if err != nil {
				return fmt.Errorf("revert migration %04d_%s: %w", m.Version, m.Name, err)
			}
			reverted = append(reverted, m.Version)
		}
		return nil
	})
	return reverted, err
}

func withLock(ctx context.Context, conn *pgx.Conn, fn func() error) (err error) {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(lockKey)); err != nil {
		return fmt.Errorf("take migration lock: %w", err)
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
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return nil, false, fmt.Errorf("connect: %w", err)
	}
	cfg, perr := pgx.ParseConfig(dsn)
	if perr != nil {
		return nil, false, fmt.Errorf("parse database url: %w", perr)
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
