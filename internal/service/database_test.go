package service_test

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/testing/testcert"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// A server other than this host needs TLS that verifies it; this host's
// (loopback addresses, localhost, Unix sockets) does not; each refusal
// names DATABASE_ALLOW_INSECURE, which accepts it.
func TestDatabaseURLNeedsVerifiedTLSOffThisHost(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "test CA").WriteFile(t, t.TempDir())
	tests := []struct {
		dsn string
		ok  bool
	}{
		{"postgres://app:pw@127.0.0.1:5432/db?sslmode=disable", true},
		{"postgres://app:pw@127.10.0.3:5432/db", true},
		{"postgres://app:pw@[::1]:5432/db?sslmode=disable", true},
		{"postgres://app:pw@localhost/db?sslmode=disable", true},
		{"host=/var/run/postgresql user=app dbname=db", true},
		{"postgres:///db?host=/tmp", true},
		{"postgres://app:pw@db.example:5432/db?sslmode=verify-full", true},
		{"postgres://app:pw@db.example:5432/db?sslmode=verify-ca&sslrootcert=" + ca, true},
		{"postgres://app:pw@db.example:5432/db?sslmode=require&sslrootcert=" + ca, true}, // require with a root CA is verify-ca
		{"host=db.example user=app sslmode=verify-full", true},

		{"postgres://app:pw@db.example:5432/db", false}, // prefer: plaintext fallback, nothing verified
		{"postgres://app:pw@db.example:5432/db?sslmode=disable", false},
		{"postgres://app:pw@db.example:5432/db?sslmode=allow", false},
		{"postgres://app:pw@db.example:5432/db?sslmode=prefer", false},
		{"postgres://app:pw@db.example:5432/db?sslmode=require", false},
		{"postgres://app:pw@10.0.0.5:5432/db?sslmode=disable", false},
		{"postgres://app:pw@127.0.0.1:5432,db.example:5432/db?sslmode=disable", false}, // every host counts
		{"host=db.example user=app password=pw", false},
	}
	for _, tt := range tests {
		err := service.CheckDatabaseURL(tt.dsn, false)
		if tt.ok != (err == nil) {
			t.Errorf("CheckDatabaseURL(%q) = %v, want ok %v", tt.dsn, err, tt.ok)
			continue
		}
		if err != nil {
			for _, w := range []string{"DATABASE_URL", "verify-full", "DATABASE_ALLOW_INSECURE=true"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("CheckDatabaseURL(%q) = %q, does not name %s", tt.dsn, err, w)
				}
			}
			if strings.Contains(err.Error(), "pw") {
				t.Errorf("error holds the password: %q", err)
			}
		}
		if err := service.CheckDatabaseURL(tt.dsn, true); err != nil {
			t.Errorf("CheckDatabaseURL(%q, allow insecure) = %v", tt.dsn, err)
		}
	}
}

// pgx's parse errors quote the connection string and mask the password
// only where they find it: neither "password = S3cret" (libpq's keyword
// form with spaces) nor a URL password with an unescaped "@" is masked.
// Start-up says which setting does not parse, and nothing of its value.
func TestDatabaseURLErrorsHoldNoPassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"host=db.example user=app password = S3cret port=bad sslmode=verify-full",
		"host=db.example user=app password = S3cret sslmode=bogus",
		"postgres://app:S3c@ret@db.example:5432/db?sslmode=verify-full",
		"postgres://app:S3c@ret@db.example:port/db?sslmode=verify-full",
		"postgres://app:S3c@ret@127.0.0.1:5432/db",
	} {
		for _, insecure := range []string{"", "true"} {
			var out strings.Builder
			s := envflag.New("prog", testkit.EnvMap(map[string]string{"DATABASE_URL": dsn, "DATABASE_ALLOW_INSECURE": insecure}), &out)
			var db service.Database
			service.BindDatabase(s, &db)
			code, stop := s.Command(nil)
			msg := out.String()
			if !stop || code != 2 || !strings.Contains(msg, "DATABASE_URL") {
				t.Errorf("%q: exit %d, stop %v, output %q; want exit 2 naming DATABASE_URL", dsn, code, stop, msg)
			}
			for _, secret := range []string{"S3c", "ret"} {
				if strings.Contains(msg, secret) {
					t.Errorf("%q: the error holds %q: %q", dsn, secret, msg)
				}
			}
		}
	}
}

// The check runs for every binding: a file (DATABASE_URL_FILE) as well.
func TestBindDatabase(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(file, []byte("postgres://app:pw@db.example/db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		env  map[string]string
		want string // "" when it parses
	}{
		{map[string]string{"DATABASE_URL_FILE": file}, "DATABASE_ALLOW_INSECURE"},
		{map[string]string{"DATABASE_URL_FILE": file, "DATABASE_ALLOW_INSECURE": "true"}, ""},
		{map[string]string{"DATABASE_URL": "postgres://app:pw@127.0.0.1/db"}, ""},
		{map[string]string{}, "DATABASE_URL"},
	} {
		s := envflag.New("prog", testkit.EnvMap(tt.env), io.Discard)
		var url service.Database
		service.BindDatabase(s, &url)
		err := s.Parse(nil)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%v: Parse = %v, want %q", tt.env, err, tt.want)
		}
	}
}

// A listen address is this host's only when its host is a loopback
// address or localhost; every interface, another address or a name is not.
func TestLoopbackListen(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8089": true, "127.0.0.2:0": true, "[::1]:8089": true, "localhost:8089": true, "LOCALHOST.:8089": true,
		":8089": false, "0.0.0.0:8089": false, "[::]:8089": false, "192.0.2.10:8089": false, "console.example:8089": false,
		"127.0.0.1": false, "": false,
	} {
		if got := service.LoopbackListen(addr); got != want {
			t.Errorf("LoopbackListen(%q) = %v, want %v", addr, got, want)
		}
	}
}
