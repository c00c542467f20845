package pgscram_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/pgscram"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The verifier is the one PostgreSQL computes itself from the same
// password and salt: the server hashes a password sent in clear (the thing
// pgscram exists to avoid, done here once with a throwaway password), and
// the verifier recomputed with the salt it chose matches byte for byte.
func TestVerifierMatchesPostgres(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	role := fmt.Sprintf("pgscram_test_%d", time.Now().UnixNano())
	const password = "Throwaway pw: 0~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./"
	if _, err := conn.Exec(ctx, "SET password_encryption = 'scram-sha-256'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE ROLE %s PASSWORD %s", role, quote(password))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP ROLE "+role) })
	var stored string
	if err := conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	// SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>
	head, _, ok := strings.Cut(strings.TrimPrefix(stored, "SCRAM-SHA-256$"), "$")
	iterText, saltText, ok2 := strings.Cut(head, ":")
	if !strings.HasPrefix(stored, "SCRAM-SHA-256$") || !ok || !ok2 {
		t.Fatalf("the server stored %q, not a SCRAM verifier", stored)
	}
	iter, err := strconv.Atoi(iterText)
	if err != nil {
		t.Fatal(err)
	}
	salt, err := base64.StdEncoding.DecodeString(saltText)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgscram.VerifierWithSalt(password, salt, iter)
	if err != nil {
		t.Fatal(err)
	}
	if got != stored {
		t.Fatalf("verifier\n%s\nthe server's\n%s", got, stored)
	}
	// A fresh salt each time, PostgreSQL's count and salt length.
	a, _ := pgscram.Verifier(password)
	b, _ := pgscram.Verifier(password)
	if a == b || !strings.HasPrefix(a, fmt.Sprintf("SCRAM-SHA-256$%d:", pgscram.Iterations)) {
		t.Fatalf("two verifiers %q and %q", a, b)
	}
}

// What PostgreSQL might prepare differently (SASLprep) is refused, and the
// error does not hold the password.
func TestVerifierRefusesWhatSASLprepChanges(t *testing.T) {
	t.Parallel()
	for _, pw := range []string{"", "caf\u00e9-secret", "tab\there", "nbsp\u00a0x"} {
		_, err := pgscram.Verifier(pw)
		if err == nil {
			t.Errorf("%q: no error", pw)
			continue
		}
		if pw != "" && strings.Contains(err.Error(), pw) {
			t.Errorf("the error holds the password: %v", err)
		}
	}
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
