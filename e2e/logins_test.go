package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/testing/pgserver"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// deploy/postgres/logins.sh (docker-compose's db-logins) sets the login
// roles' passwords without sending them: on a throwaway server that logs
// every statement (log_statement=all) and accepts the logins by SCRAM
// only, no password appears in the server's log, each role stores a
// SCRAM-SHA-256 verifier, and each logs in with its password over SCRAM (a
// wrong one is refused). A second run (a restart of compose) changes the
// passwords the same way.
func TestLoginsScriptSendsNoPassword(t *testing.T) {
	bin, err := pgserver.FindBin()
	if err != nil {
		t.Skip(err)
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		psql = filepath.Join(bin, "psql")
	}
	dir, err := pgserver.NewDir("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pgserver.Init(ctx, bin, dir, "data", testport.Reserve(t))
	if err != nil {
		t.Fatal(err)
	}
	// The owner over trust (the script's PGPASSWORD is not checked); every
	// other role over SCRAM only; every statement logged.
	hba := "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(srv.Data, "pg_hba.conf"), []byte(hba), 0o644); err != nil {
		t.Fatal(err)
	}
	conf, err := os.OpenFile(filepath.Join(srv.Data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// md5 by default here: a password sent in clear would be stored as md5.
	_, err = conf.WriteString("log_statement = 'all'\nlog_min_error_statement = 'debug5'\npassword_encryption = 'md5'\n")
	conf.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.StopQuietly)
	if err := pgtest.Migrate(ctx, srv.URL("postgres")); err != nil {
		t.Fatal(err)
	}

	secrets := t.TempDir()
	passwords := map[string]string{}
	run := func() {
		t.Helper()
		for _, r := range []string{"owner", "relay", "sender", "receiver"} {
			b := make([]byte, 12)
			_, _ = rand.Read(b)
			passwords[r] = "pw-" + r + "-" + hex.EncodeToString(b)
			if err := os.WriteFile(filepath.Join(secrets, "pg_"+r+"_password"), []byte(passwords[r]+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.CommandContext(ctx, "/bin/sh", "../deploy/postgres/logins.sh")
		cmd.Env = append(os.Environ(), "SECRETS_DIR="+secrets, "PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", srv.Port),
			"PGUSER=postgres", "PGDATABASE=postgres",
			// The relay binary (relay scram-verifier), then psql.
			"PATH="+binaries(t)+":"+filepath.Dir(psql)+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("logins.sh: %v\n%s", err, out)
		}
		for r, pw := range passwords {
			if strings.Contains(string(out), pw) {
				t.Fatalf("logins.sh printed the %s password", r)
			}
		}
	}
	for round := range 2 {
		run()
		for _, r := range []string{"relay", "sender", "receiver"} {
			login := r + "_login"
			var stored string
			var member bool
			if err := pgxQueryRow(ctx, srv.URL("postgres"), `SELECT rolpassword, pg_has_role(rolname, 'sendonce_'||$2, 'MEMBER')
				FROM pg_authid WHERE rolname = $1`, []any{login, r}, &stored, &member); err != nil {
				t.Fatalf("round %d: %s: %v", round, login, err)
			}
			if !strings.HasPrefix(stored, "SCRAM-SHA-256$") || !member {
				t.Fatalf("round %d: %s stores %.20q..., member of sendonce_%s %v", round, login, stored, r, member)
			}
			dsn := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=disable", login, passwords[r], srv.Port)
			if err := pgxQueryRow(ctx, dsn, "SELECT 1", nil, new(int)); err != nil {
				t.Fatalf("round %d: %s cannot log in with its password: %v", round, login, err)
			}
			bad := fmt.Sprintf("postgres://%s:wrong@127.0.0.1:%d/postgres?sslmode=disable", login, srv.Port)
			if err := pgxQueryRow(ctx, bad, "SELECT 1", nil, new(int)); err == nil {
				t.Fatalf("round %d: %s logs in with a wrong password", round, login)
			}
		}
		log, err := os.ReadFile(srv.LogPath())
		if err != nil {
			t.Fatal(err)
		}
		// The log holds the statements (so that the check below means
		// something), and none of the passwords.
		if !strings.Contains(string(log), "ALTER ROLE") {
			t.Fatalf("the server log holds no ALTER ROLE: log_statement is not in force\n%s", log)
		}
		for r, pw := range passwords {
			if r != "owner" && strings.Contains(string(log), pw) {
				t.Fatalf("round %d: the server log holds the %s password", round, r)
			}
		}
	}
}

func pgxQueryRow(ctx context.Context, dsn, sql string, args []any, dst ...any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dst...)
}
