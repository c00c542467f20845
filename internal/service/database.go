package service

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/outbox"
)

// Database is how a program reaches Postgres.
type Database struct {
	// URL is DATABASE_URL (required): the database holding sms_outbox.
	URL string
	// Pooler is DATABASE_POOLER: what stands between the program and
	// Postgres (none, session or transaction).
	Pooler outbox.Pooler
}

// BindDatabase binds DATABASE_URL (required; a secret, from the variable
// or DATABASE_URL_FILE), DATABASE_POOLER and DATABASE_ALLOW_INSECURE to s,
// and checks the URL at start-up with CheckDatabaseURL. Every program that
// reaches the database binds it this way.
func BindDatabase(s *envflag.Set, db *Database) {
	s.Group("database")
	insecure := new(bool)
	s.Secret(&db.URL, "database-url", "DATABASE_URL", "Postgres URL of the database holding sms_outbox (may hold a password); a server other than this host needs sslmode=verify-full or verify-ca")
	s.Required(&db.URL, "database-url")
	pooler := new(string)
	s.Enum(pooler, "database-pooler", "DATABASE_POOLER", string(outbox.NoPooler), outbox.Poolers,
		"what DATABASE_URL reaches: none (Postgres itself), session (a pooler in session mode) or transaction (a pooler in transaction mode, e.g. PgBouncer pool_mode=transaction, Supavisor, RDS Proxy): then no startup parameter, no named prepared statement and no session state is used, and the relay's LISTEN needs DATABASE_DIRECT_URL (docs/operations.md, behind a connection pooler)")
	s.Bool(insecure, "database-allow-insecure", "DATABASE_ALLOW_INSECURE", false,
		"accept a DATABASE_URL that reaches a server other than this host without sslmode=verify-full or verify-ca (the password and the rows then cross the network in clear or to a server nobody verified)")
	s.Check(func() error {
		db.Pooler = outbox.Pooler(*pooler)
		if strings.TrimSpace(db.URL) == "" {
			return nil // Required says so
		}
		return CheckDatabaseURL(db.URL, *insecure)
	})
}

// BindDirectURL binds DATABASE_DIRECT_URL (a secret, from the variable or
// DATABASE_DIRECT_URL_FILE): the relay's way to Postgres itself, past a
// transaction pooler, for what needs a session of its own (LISTEN, and
// relay migrate's lock). Empty: DATABASE_URL, unless that goes through a
// transaction pooler.
func BindDirectURL(s *envflag.Set, dsn *string) {
	insecure := new(bool)
	s.Secret(dsn, "database-direct-url", "DATABASE_DIRECT_URL", "Postgres URL of the same database reaching Postgres itself, past a transaction pooler: the relay's LISTEN and relay migrate use it (default DATABASE_URL, unless DATABASE_POOLER=transaction; then without it the relay polls and relay migrate refuses to run)")
	s.Bool(insecure, "database-direct-allow-insecure", "DATABASE_DIRECT_ALLOW_INSECURE", false,
		"accept a DATABASE_DIRECT_URL that reaches a server other than this host without sslmode=verify-full or verify-ca")
	s.Check(func() error {
		if strings.TrimSpace(*dsn) == "" {
			return nil
		}
		if err := CheckDatabaseURL(*dsn, *insecure); err != nil {
			return fmt.Errorf("DATABASE_DIRECT_URL: %s", strings.TrimPrefix(err.Error(), "DATABASE_URL: "))
		}
		return nil
	})
}

// Session returns the URL and the pooler of a connection that holds a
// session of its own: direct when set, else db's unless db goes through a
// transaction pooler (ok false).
func (db Database) Session(direct string) (Database, bool) {
	switch {
	case direct != "":
		return Database{URL: direct, Pooler: outbox.NoPooler}, true
	case db.Pooler == outbox.TransactionPooler:
		return Database{}, false
	}
	return db, true
}

// Connect opens one connection to db, through its pooler. Errors name the
// setting to check.
func Connect(ctx context.Context, db Database) (*pgx.Conn, error) {
	cfg, err := outbox.ConnConfig(db.URL, db.Pooler)
	if err != nil {
		return nil, errUnparsable
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, connectError(err)
	}
	return conn, nil
}

// checkStartupParameters refuses a direct connection (DATABASE_POOLER=none)
// whose startup parameter did not arrive: a pooler in between dropped it
// (PgBouncer's ignore_startup_parameters), and may be one that pools
// transactions, where the named prepared statements used directly would fail
// at random later. The session's reset value is what the startup packet
// set, whatever a SET did since.
func checkStartupParameters(ctx context.Context, pool *pgxpool.Pool, db Database) error {
	if db.Pooler != outbox.NoPooler && db.Pooler != "" {
		return nil
	}
	if cfg, err := pgx.ParseConfig(db.URL); err != nil || cfg.RuntimeParams["plan_cache_mode"] != "" {
		return nil // the DSN's own value, whatever it is
	}
	var reset string
	if err := pool.QueryRow(ctx, `SELECT reset_val FROM pg_settings WHERE name = 'plan_cache_mode'`).Scan(&reset); err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	if reset != "force_custom_plan" {
		return errors.New("DATABASE_URL reaches Postgres through something that drops startup parameters (a connection pooler with ignore_startup_parameters?): set DATABASE_POOLER=session or DATABASE_POOLER=transaction as the pooler runs (docs/operations.md, behind a connection pooler)")
	}
	return nil
}

// connectError names the setting behind a failed connection: a pooler that
// refuses a startup parameter says so in its own words, which name no
// setting of ours.
func connectError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "startup parameter") {
		return fmt.Errorf("DATABASE_URL reaches a connection pooler that refuses a startup parameter (%s): set DATABASE_POOLER=session or DATABASE_POOLER=transaction as the pooler runs (docs/operations.md, behind a connection pooler)", pgErr.Message)
	}
	return fmt.Errorf("DATABASE_URL: %w", err)
}

// errUnparsable is every parse failure of DATABASE_URL. pgx's parse errors
// quote the connection string with the password masked only where it can
// find it: "password = s3cret" (spaces around the "=") or a URL password
// with an unescaped "@" reach the message whole. So the error names the
// setting and what to check, never the value nor the parser's words.
var errUnparsable = errors.New("DATABASE_URL: cannot be parsed as a postgres:// URL or as key=value pairs " +
	"(in a URL, escape '@', ':' and '/' in the password as %40, %3A and %2F; check the files sslrootcert, sslcert and sslkey name)")

// CheckDatabaseURL checks that dsn parses and that each server it names is
// either on this host (a 127.0.0.0/8 or ::1 address, localhost, a Unix
// socket) or reached over TLS that verifies the server's certificate
// (sslmode=verify-full or verify-ca, or sslrootcert=system). pgx's default,
// sslmode=prefer, falls back to plaintext and verifies nothing, and
// sslmode=require verifies nothing either. allowInsecure
// (DATABASE_ALLOW_INSECURE) accepts such a server. Errors never hold the
// value.
func CheckDatabaseURL(dsn string, allowInsecure bool) error {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return errUnparsable
	}
	// The main config and the fallbacks pgx tries after it: the plaintext
	// retry of sslmode=prefer and every other host of a list.
	tries := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	for _, t := range tries {
		if strings.Contains(t.Host, "@") {
			// No host name holds an "@": the password's own "@" ended
			// the userinfo early, and the rest of the password became
			// the host (to appear in every connection error).
			return errors.New("DATABASE_URL: the host holds an '@': escape an '@' in the password as %40")
		}
	}
	if allowInsecure {
		return nil
	}
	for _, t := range tries {
		if LoopbackHost(t.Host) || verifiesServer(t.TLSConfig) {
			continue
		}
		return fmt.Errorf("DATABASE_URL: a server other than this host is reached without sslmode=verify-full or sslmode=verify-ca " +
			"(the password and the rows would cross the network in clear or to a server nobody verified): " +
			"set sslmode=verify-full (with sslrootcert), or DATABASE_ALLOW_INSECURE=true to accept it")
	}
	return nil
}

// LoopbackHost reports whether host, as pgx parsed it, is on this host: a
// Unix socket directory, localhost, or a loopback address.
func LoopbackHost(host string) bool {
	if strings.HasPrefix(host, "/") {
		return true
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// LoopbackListen reports whether a listen address (host:port) is reached
// from this host only: a loopback address or localhost. An empty host
// (":8089"), an unspecified address and any other name listen where other
// hosts reach them.
func LoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host != "" && !strings.HasPrefix(host, "/") && LoopbackHost(host)
}

// verifiesServer reports whether pgx verifies the server's certificate
// with c: verify-full leaves Go's verification on; verify-ca (and require
// with a root CA) turns it off and verifies the chain itself.
func verifiesServer(c *tls.Config) bool {
	return c != nil && (!c.InsecureSkipVerify || c.VerifyPeerCertificate != nil)
}
