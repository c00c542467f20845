// Package outbox holds every SQL statement on the sms_outbox table except
// the applications' own (the public package github.com/sendonce/sendonce/outbox
// writes and reads messages): the relay's claim and mark, the senders' claim
// and status writes, the reconciler's and the operators' statements.
//
// Statuses move forward only (I3): pending -> queued -> sending -> sent, dead
// or unknown; a retry moves sending back to queued, which is not a regression
// but the end of one attempt. Every write is guarded by the statuses it may
// leave, so a late or duplicate delivery never overwrites a terminal row.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

// State is the status of an outbox row; the public package defines it, so
// that a status read by an application and one written here are one type.
type State = outbox.State

// The statuses, as the public package defines them.
const (
	StatusPending     = outbox.StatusPending
	StatusQueued      = outbox.StatusQueued
	StatusSending     = outbox.StatusSending
	StatusSent        = outbox.StatusSent
	StatusDelivered   = outbox.StatusDelivered
	StatusUndelivered = outbox.StatusUndelivered
	StatusDead        = outbox.StatusDead
	StatusUnknown     = outbox.StatusUnknown
)

// ErrNotFound is returned for an id that has no row; it is the public
// package's, so that callers match one error whichever package read the row.
var ErrNotFound = outbox.ErrNotFound

// Unsent returns the status and dead-letter reason of a row that will not be
// sent for reason (its attempts ran out, or the provider refused it). dead
// tells the application the user got nothing, which is only known when no
// attempt may have reached the provider; otherwise the row is unknown, with
// reason ambiguous.
func Unsent(maybeAccepted bool, reason string) (State, string) {
	if maybeAccepted {
		return StatusUnknown, wire.ReasonAmbiguous
	}
	return StatusDead, reason
}

// DefaultDBTimeout is the default bound on one database round trip of the
// statements here, for every component that runs them (DB_TIMEOUT).
const DefaultDBTimeout = 10 * time.Second

// Querier is what the statements here need: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrUnparsableDSN is a connection string that does not parse. It never
// holds the string: "password = s3cret" (spaces around "=") or a URL
// password with an unescaped "@" would reach the message whole.
var ErrUnparsableDSN = errors.New("cannot parse the connection string (left out: it may hold a password)")

// PoolConfig parses dsn into a pool config for the statements of this
// package: each execution of a prepared statement is planned for its
// parameters (plan_cache_mode=force_custom_plan, unless the DSN sets it). A
// generic plan made while the table was small or never analyzed scans the
// whole table later; measured by make bench: ~100M tuples seq-scanned per
// run without it, ~70k with it, and 30% less Postgres CPU per message.
// AllowGenericPlans relaxes this where the table is large enough.
//
// A parse failure is ErrUnparsableDSN, without pgx's words: they quote the
// connection string, whose password pgx masks only where it finds it.
func PoolConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, ErrUnparsableDSN
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	if _, set := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	return cfg, nil
}

// GenericPlansMinBytes is the least size of sms_outbox's heap at which a
// connection of AllowGenericPlans may reuse generic plans: 128 pages. A
// generic plan of the senders' statements finds rows through the primary
// key from about 50 pages up (measured with EXPLAIN EXECUTE at 1,100 rows
// of 370 bytes, analyzed or not) and scans the table below that.
const GenericPlansMinBytes = 1 << 20

// AllowGenericPlans lets each connection of cfg reuse a generic plan of a
// prepared statement once Postgres finds it no costlier than planning for
// the parameters (plan_cache_mode=auto), when sms_outbox holds at least
// GenericPlansMinBytes as the connection opens; otherwise the connection
// keeps PoolConfig's custom plans. A DSN that sets plan_cache_mode is left
// alone.
//
// Planning is most of the Postgres work of a small batch's claim or status
// write. A generic plan is made once, on the table as it is then, and kept
// until the table's statistics change: made on a nearly empty table it scans
// the whole table on every execution. The size check keeps plans from being
// made on a small table; on a table that shrinks later, an index plan stays
// cheap, and connections are replaced within MaxConnLifetime.
func AllowGenericPlans(cfg *pgxpool.Config) {
	if dsn, err := pgxpool.ParseConfig(cfg.ConnString()); err != nil || dsn.ConnConfig.RuntimeParams["plan_cache_mode"] != "" {
		return
	}
	next := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if next != nil {
			if err := next(ctx, conn); err != nil {
				return err
			}
		}
		// One round trip; to_regclass leaves a database without the
		// table (yet) on custom plans.
		_, err := conn.Exec(ctx, `SELECT set_config('plan_cache_mode',
			CASE WHEN coalesce(pg_relation_size(to_regclass('sms_outbox')), 0) >= $1 THEN 'auto' ELSE 'force_custom_plan' END,
			false)`, int64(GenericPlansMinBytes))
		if err != nil {
			return fmt.Errorf("outbox: choose plan_cache_mode: %w", err)
		}
		return nil
	}
}
