package service

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce/internal/envflag"
)

// BindDatabase binds DATABASE_URL (required; a secret, from the variable
// or DATABASE_URL_FILE) and DATABASE_ALLOW_INSECURE to s, and checks the URL
// at start-up with CheckDatabaseURL. Every program that reaches the
// database binds it this way.
func BindDatabase(s *envflag.Set, dsn *string) {
	insecure := new(bool)
	s.Secret(dsn, "database-url", "DATABASE_URL", "Postgres URL of the database holding sms_outbox (may hold a password); a server other than this host needs sslmode=verify-full or verify-ca")
	s.Required(dsn, "database-url")
	s.Bool(insecure, "database-allow-insecure", "DATABASE_ALLOW_INSECURE", false,
		"accept a DATABASE_URL that reaches a server other than this host without sslmode=verify-full or verify-ca (the password and the rows then cross the network in clear or to a server nobody verified)")
	s.Check(func() error {
		if strings.TrimSpace(*dsn) == "" {
			return nil // Required says so
		}
		return CheckDatabaseURL(*dsn, *insecure)
	})
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

// verifiesServer reports whether pgx verifies the server's certificate
// with c: verify-full leaves Go's verification on; verify-ca (and require
// with a root CA) turns it off and verifies the chain itself.
func verifiesServer(c *tls.Config) bool {
	return c != nil && (!c.InsecureSkipVerify || c.VerifyPeerCertificate != nil)
}
