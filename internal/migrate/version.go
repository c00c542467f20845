package migrate

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce"
)

// Querier is what CheckVersion needs: a pool, a connection or a
// transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Latest returns the newest version among migrations (0 for none): the
// schema version a binary embedding them requires.
func Latest(migrations []Migration) int {
	v := 0
	for _, m := range migrations {
		v = max(v, m.Version)
	}
	return v
}

// CheckVersion returns the database's schema version (the newest recorded
// migration) and, when it is below need, an error wrapping ErrSchemaTooOld
// that says which version was found and which is needed. A newer schema is
// fine: every migration is written so that the release before it runs on
// it, which is what lets old and new binaries run side by side during a
// rolling upgrade.
func CheckVersion(ctx context.Context, q Querier, need int) (int, error) {
	var found int
	err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM sendonce_schema_migrations`).Scan(&found)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return 0, fmt.Errorf("%w: found no sendonce schema (version 0), need version %d: run `relay migrate` of this release first", ErrSchemaTooOld, need)
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		// Migration 0009 grants the read to the sendonce roles: a role
		// that cannot read it is on a schema older than that.
		return 0, fmt.Errorf("%w: cannot read sendonce_schema_migrations (permission denied: granted to the sendonce roles by migration 0009), need version %d: run `relay migrate` of this release first", ErrSchemaTooOld, need)
	case err != nil:
		return 0, fmt.Errorf("read the schema version: %w", err)
	case found < need:
		return found, fmt.Errorf("%w: found version %d, need version %d: run `relay migrate` of this release first", ErrSchemaTooOld, found, need)
	}
	return found, nil
}

// CheckEmbedded is CheckVersion against the newest migration this binary
// embeds: the start-up check of every long-running command. It returns the
// version found and the version needed. A schema at the newest version
// that lacks an older one (a migration numbered below one applied before
// it, as 0010 is below 0011) is too old as well: the newest version alone
// does not prove it.
func CheckEmbedded(ctx context.Context, q Querier) (found, need int, err error) {
	migs, err := Load(sendonce.Migrations, "migrations")
	if err != nil {
		return 0, 0, err
	}
	need = Latest(migs)
	found, err = CheckVersion(ctx, q, need)
	if err != nil {
		return found, need, err
	}
	versions := make([]int32, len(migs))
	for i, m := range migs {
		versions[i] = int32(m.Version)
	}
	var missing []int32
	if err := q.QueryRow(ctx, `SELECT coalesce(array_agg(v ORDER BY v), '{}') FROM unnest($1::int[]) v
		WHERE v NOT IN (SELECT version FROM sendonce_schema_migrations)`, versions).Scan(&missing); err != nil {
		return found, need, fmt.Errorf("read the schema version: %w", err)
	}
	if len(missing) > 0 {
		return found, need, fmt.Errorf("%w: found version %d without migration %d: run `relay migrate` of this release first", ErrSchemaTooOld, found, missing[0])
	}
	return found, need, nil
}
