// Package outbox holds every SQL statement on the sms_outbox table except
// the applications' own (the public package github.com/sendonce/sendonce/outbox
// writes and reads messages): the relay's claim and mark, the senders' claim
// and status writes, the reconciler's and the operators' statements. Each
// statement is a file of sql/, loaded once at initialization (sql.go).
//
// Statuses move forward only (I3): pending -> queued -> sending -> sent, dead
// or unknown; a retry moves sending back to queued, which is not a regression
// but the end of one attempt. Every write is guarded by the statuses it may
// leave, so a late or duplicate delivery never overwrites a terminal row.
package outbox

import (
	"cmp"
	"context"
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
	StatusScheduled   = outbox.StatusScheduled
	StatusExpired     = outbox.StatusExpired
	StatusCancelled   = outbox.StatusCancelled
	StatusSuppressed  = outbox.StatusSuppressed
)

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

// Pooler names what stands between the processes and Postgres
// (DATABASE_POOLER).
type Pooler string

// The poolers the processes know how to work through.
const (
	// NoPooler: the processes reach Postgres itself (or a pooler that
	// passes sessions through whole).
	NoPooler Pooler = "none"
	// SessionPooler: a pooler that gives a client one server connection
	// for its whole session (PgBouncer's pool_mode=session). It refuses
	// startup parameters it does not know, so session settings are made
	// with SET once connected.
	SessionPooler Pooler = "session"
	// TransactionPooler: a pooler that gives a client a server connection
	// for one transaction at a time (PgBouncer's pool_mode=transaction,
	// Supavisor's and RDS Proxy's usual mode). Nothing may rest on session
	// state: no startup parameters, no named prepared statements (each
	// statement is described once per connection and then sent unnamed,
	// pgx's cache_describe mode), no session settings, no LISTEN.
	TransactionPooler Pooler = "transaction"
)

// Poolers are the values of DATABASE_POOLER.
var Poolers = []string{string(NoPooler), string(SessionPooler), string(TransactionPooler)}

// ConnConfig parses dsn into a connection config that works through
// pooler. A parse failure is ErrUnparsableDSN, without pgx's words: they
// quote the connection string, whose password pgx masks only where it
// finds it.
func ConnConfig(dsn string, pooler Pooler) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, ErrUnparsableDSN
	}
	if pooler == TransactionPooler {
		// A named prepared statement lives in one server session; through
		// a transaction pooler the next statement may reach another.
		// cache_describe sends every statement unnamed, with the
		// parameter types described once per connection, so that every
		// parameter (a UUID array too) is still encoded in binary.
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	return cfg, nil
}

// PoolConfig parses dsn into a pool config for the statements of this
// package, through pooler: each execution of a prepared statement is
// planned for its parameters (plan_cache_mode=force_custom_plan, unless the
// DSN sets it). A generic plan made while the table was small or never
// analyzed scans the whole table later; measured by make bench: ~100M
// tuples seq-scanned per run without it, ~70k with it, and 30% less
// Postgres CPU per message. AllowGenericPlans relaxes this where the table
// is large enough.
//
// Directly, the setting is a startup parameter. A session pooler refuses
// startup parameters it does not know, so it is SET once connected. Through
// a transaction pooler every statement is unnamed and so planned for its
// parameters anyway, and nothing is set.
func PoolConfig(dsn string, pooler Pooler) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, ErrUnparsableDSN
	}
	conn, err := ConnConfig(dsn, pooler)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig = conn
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	if mode, set := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; set {
		// The DSN's own choice, made the way the pooler allows.
		switch pooler {
		case SessionPooler:
			delete(cfg.ConnConfig.RuntimeParams, "plan_cache_mode")
			cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				if _, err := conn.Exec(ctx, setPlanCacheModeSQL, mode); err != nil {
					return fmt.Errorf("outbox: set plan_cache_mode: %w", err)
				}
				return nil
			}
		case TransactionPooler:
			return nil, ErrSessionSetting
		}
		return cfg, nil
	}
	switch pooler {
	case SessionPooler:
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, forceCustomPlansSQL); err != nil {
				return fmt.Errorf("outbox: set plan_cache_mode: %w", err)
			}
			return nil
		}
	case TransactionPooler:
	default:
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	return cfg, nil
}

// GenericPlansMinPages is the least size of sms_outbox, in 8 KiB pages
// (1 MiB), at which a connection of AllowGenericPlans may reuse generic
// plans. A generic plan of the senders' statements finds rows through the
// primary key from about 50 pages up (measured with EXPLAIN EXECUTE at 1,100
// rows of 370 bytes, analyzed or not) and scans the table below that.
const GenericPlansMinPages = 128

// DefaultPlanRecheck is how often AllowGenericPlans checks a busy
// connection's choice again by default.
const DefaultPlanRecheck = 10 * time.Second

// AllowGenericPlans lets each connection of cfg reuse a generic plan of a
// prepared statement when Postgres finds it no costlier than planning for
// the parameters (plan_cache_mode=auto), while sms_outbox holds at least
// GenericPlansMinPages; otherwise the connection keeps PoolConfig's custom
// plans. The size is read when a connection opens and again when it is
// acquired once recheck (0: DefaultPlanRecheck) has passed since. A DSN
// that sets the plan_cache_mode parameter is left alone, and so is a pool
// that prepares no statement (through a transaction pooler).
//
// Planning is most of the Postgres work of a small batch's claim or status
// write. A generic plan is made on the table as it is then, and made again
// whenever the table's statistics or storage change: made on a nearly
// empty table it scans the whole table on every execution until then. So a
// connection uses generic plans only while the table is large: one whose
// table shrank (a retention purge and a vacuum, a truncation) goes back to
// custom plans within recheck, and one that goes back to generic plans
// drops every plan it cached, which may have been made on the small table.
//
// The size is pg_class.relpages, which takes no lock (a migration waiting
// for its lock does not hold up a connection) and lags the table: it is
// brought up to date by vacuum and analyze, and to zero by a truncation,
// so a table that grew since is still read as small, the safe side.
func AllowGenericPlans(cfg *pgxpool.Config, recheck time.Duration) {
	if dsn, err := pgxpool.ParseConfig(cfg.ConnString()); err != nil || dsn.ConnConfig.RuntimeParams["plan_cache_mode"] != "" {
		return
	}
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		// No prepared statement outlives its execution (a transaction
		// pooler): no plan is reused, and no session setting may be made.
		return
	}
	recheck = cmp.Or(recheck, DefaultPlanRecheck)
	afterConnect, prepare := cfg.AfterConnect, cfg.PrepareConn
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if afterConnect != nil {
			if err := afterConnect(ctx, conn); err != nil {
				return err
			}
		}
		return choosePlans(ctx, conn)
	}
	cfg.PrepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		if prepare != nil {
			if ok, err := prepare(ctx, conn); !ok || err != nil {
				return ok, err
			}
		}
		if at, _ := conn.PgConn().CustomData()[plansCheckedKey].(time.Time); time.Since(at) < recheck {
			return true, nil
		}
		// A failed check leaves the connection as it was; a broken
		// connection fails the query that follows.
		_ = choosePlans(ctx, conn)
		return true, nil
	}
}

// plansCheckedKey and plansModeKey hold, in a connection's custom data,
// when choosePlans last ran on it and what it chose.
const (
	plansCheckedKey = "sendonce.plans_checked"
	plansModeKey    = "sendonce.plans_mode"
)

// choosePlans sets conn's plan_cache_mode from sms_outbox's size, and drops
// the plans conn cached when it turns to generic plans.
func choosePlans(ctx context.Context, conn *pgx.Conn) error {
	var mode string
	err := conn.QueryRow(ctx, choosePlansSQL, GenericPlansMinPages).Scan(&mode)
	if err != nil {
		return fmt.Errorf("outbox: choose plan_cache_mode: %w", err)
	}
	data := conn.PgConn().CustomData()
	if mode == "auto" && data[plansModeKey] != "auto" {
		if _, err := conn.Exec(ctx, discardPlansSQL); err != nil {
			return fmt.Errorf("outbox: discard plans: %w", err)
		}
	}
	data[plansModeKey], data[plansCheckedKey] = mode, time.Now()
	return nil
}

// The statements of this file (sql.go).
var (
	choosePlansSQL      = stmt("choose_plans")
	discardPlansSQL     = stmt("discard_plans")
	forceCustomPlansSQL = stmt("force_custom_plans")
	setPlanCacheModeSQL = stmt("set_plan_cache_mode")
)
