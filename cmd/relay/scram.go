package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sendonce/sendonce/internal/pgscram"
)

// maxPasswordLen bounds what relay scram-verifier reads.
const maxPasswordLen = 1024

// runScramVerifier is "relay scram-verifier": it reads one password on
// standard input (never from its command line, which ps shows to every
// user of the host) and prints its PostgreSQL SCRAM-SHA-256 verifier with
// a fresh salt, for ALTER ROLE ... PASSWORD '<verifier>': the server then
// never sees the password (deploy/postgres/logins.sh).
func runScramVerifier(_ context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) int {
	return scramVerifier(args, os.Stdin, stdout, stderr)
}

func scramVerifier(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprintln(stderr, "relay scram-verifier reads a password on standard input (trailing newlines removed, as $(cat file) does) and prints its PostgreSQL SCRAM-SHA-256 verifier, for ALTER ROLE ... PASSWORD '<verifier>'; it takes no arguments.")
			return 0
		}
		fmt.Fprintln(stderr, "relay scram-verifier: the password comes on standard input, never as an argument")
		return 2
	}
	b, err := io.ReadAll(io.LimitReader(stdin, maxPasswordLen+2))
	if err != nil {
		fmt.Fprintf(stderr, "relay scram-verifier: read standard input: %v\n", err)
		return 1
	}
	pw := strings.TrimRight(string(b), "\n")
	if len(pw) > maxPasswordLen {
		fmt.Fprintf(stderr, "relay scram-verifier: the password is longer than %d bytes\n", maxPasswordLen)
		return 2
	}
	v, err := pgscram.Verifier(pw)
	if err != nil {
		fmt.Fprintf(stderr, "relay scram-verifier: %v\n", err)
		return 2
	}
	fmt.Fprintln(stdout, v)
	return 0
}
