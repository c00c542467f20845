package main

import (
	"strings"
	"testing"

	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// relay scram-verifier prints a verifier of the password on stdin, never
// the password, and refuses a password given as an argument.
func TestScramVerifierReadsStdin(t *testing.T) {
	t.Parallel()
	var out, errOut testkit.Buffer
	if code := scramVerifier(nil, strings.NewReader("s3cret-from-a-file\n\n"), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	v := strings.TrimSpace(out.String())
	if !strings.HasPrefix(v, "SCRAM-SHA-256$4096:") || strings.Count(v, "$") != 2 || strings.Contains(out.String()+errOut.String(), "s3cret") {
		t.Fatalf("stdout %q, stderr %q", out.String(), errOut.String())
	}
	for _, c := range []struct {
		args []string
		in   string
	}{{[]string{"s3cret"}, ""}, {nil, ""}, {nil, "\n"}, {nil, strings.Repeat("x", 2000)}, {nil, "caf\u00e9"}} {
		var out, errOut testkit.Buffer
		if code := scramVerifier(c.args, strings.NewReader(c.in), &out, &errOut); code != 2 || out.String() != "" {
			t.Errorf("args %q, %d bytes in: exit %d, stdout %q", c.args, len(c.in), code, out.String())
		}
		if strings.Contains(errOut.String(), "s3cret") {
			t.Errorf("stderr shows the argument: %s", errOut.String())
		}
	}
}
