// Package nodetools gives tests the Node programs of tools/node (Stoplight
// Prism, Vonage's JWT package, Twilio's, Sinch's and Telnyx's SDKs),
// installed from its package-lock.json with npm ci into
// tools/node/node_modules (ignored by git). .ci/run installs them before
// the tests; a test that finds them missing installs them itself, one
// package at a time (a lock file). Without node and npm a test is skipped,
// except in CI (CI set), where it fails.
package nodetools

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// Dir returns tools/node with its node_modules installed.
func Dir(t testing.TB) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; .ci/run installs it (CI never skips this test)", tool)
			}
			t.Skipf("%s is not installed: this test needs Node 20 or later and npm (tools/node)", tool)
		}
	}
	dir := filepath.Join(testkit.RepoRoot(t), "tools", "node")
	lock, err := os.OpenFile(filepath.Join(dir, ".install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if installed(dir) {
		return dir
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("npm ci in tools/node: %v\n%s", err, out.String())
	}
	if !installed(dir) {
		t.Fatalf("npm ci in tools/node installed no prism\n%s", out.String())
	}
	return dir
}

// Bin returns the path of an installed program of tools/node.
func Bin(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(Dir(t), "node_modules", ".bin", name)
}

func installed(dir string) bool {
	for _, p := range []string{".bin/prism", "@vonage/jwt/package.json", "jsonwebtoken/package.json", "twilio/package.json", "@sinch/sdk-core/package.json", "telnyx/package.json"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p)); err != nil {
			return false
		}
	}
	return true
}

// Node runs a script of tools/node with args, stdin and the extra
// environment env, and returns its stdout.
func Node(t testing.TB, script string, stdin []byte, env []string, args ...string) string {
	t.Helper()
	dir := Dir(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(dir, script)}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, errb.String())
	}
	return out.String()
}

// TwilioCase is one question for Twilio's Node SDK
// (tools/node/twilio-signature.js): Op "sign" asks for the
// X-Twilio-Signature Twilio sends with a request to URL (query string
// included) of the form Params, signed with Token; Op "validate" asks
// whether the SDK's validateRequest takes that request, with Signature, as
// Twilio's.
type TwilioCase struct {
	Op        string     `json:"op"`
	Token     string     `json:"token"`
	URL       string     `json:"url"`
	Params    url.Values `json:"params"`
	Signature string     `json:"signature,omitempty"`
}

// TwilioAnswer is the SDK's answer to a TwilioCase: Signature for "sign",
// Valid for "validate".
type TwilioAnswer struct {
	Signature string `json:"signature"`
	Valid     bool   `json:"valid"`
}

// Twilio asks Twilio's Node SDK each case, in one run of node.
func Twilio(t testing.TB, cases []TwilioCase) []TwilioAnswer {
	t.Helper()
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	out := Node(t, "twilio-signature.js", in, nil)
	var answers []TwilioAnswer
	if err := json.Unmarshal([]byte(out), &answers); err != nil || len(answers) != len(cases) {
		t.Fatalf("twilio-signature.js answered %d bytes for %d cases: %v", len(out), len(cases), err)
	}
	return answers
}
