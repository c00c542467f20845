// Package pgscram computes a PostgreSQL SCRAM-SHA-256 password verifier on
// the client, so that a role's password can be set without the password
// itself ever reaching the server: ALTER ROLE ... PASSWORD 'SCRAM-SHA-256$...'
// stores the verifier as given, and neither the server log
// (log_statement), pg_stat_activity nor a statement's error shows more than
// the verifier.
package pgscram

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

// Iterations is the PBKDF2 iteration count, PostgreSQL's default
// (scram_iterations).
const Iterations = 4096

// SaltLen is the salt's length in bytes, as PostgreSQL makes them.
const SaltLen = 16

// Verifier returns the verifier of password with a fresh random salt, in
// the form rolpassword holds: SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>.
func Verifier(password string) (string, error) {
	salt := make([]byte, SaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("pgscram: salt: %w", err)
	}
	return VerifierWithSalt(password, salt, Iterations)
}

// VerifierWithSalt is Verifier with the salt and iteration count given.
//
// PostgreSQL prepares a password with SASLprep before hashing it; for
// printable ASCII that changes nothing, and anything else is refused here
// rather than hashed in a way the server might prepare differently. The
// error never holds the password.
func VerifierWithSalt(password string, salt []byte, iterations int) (string, error) {
	switch {
	case password == "":
		return "", errors.New("pgscram: the password is empty")
	case len(salt) == 0:
		return "", errors.New("pgscram: the salt is empty")
	case iterations < 1:
		return "", errors.New("pgscram: iterations must be positive")
	}
	for i := 0; i < len(password); i++ {
		if c := password[i]; c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("pgscram: the password holds a byte outside printable ASCII at offset %d: use printable ASCII", i)
		}
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("pgscram: %w", err)
	}
	clientKey := mac(salted, "Client Key")
	stored := sha256.Sum256(clientKey)
	serverKey := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(stored[:]), b64(serverKey)), nil
}

func mac(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}
