package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// The demo as make demo runs it, on freshly built binaries as separate
// processes, with faults injected: it must end with its summary and no
// duplicate.
func TestDemoRunsTheBinaries(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../relay", "../sender", "../receiver", "../smsstub")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// A default build has no crash points: nothing in it reads the variable.
	for _, b := range []string{"relay", "sender"} {
		exe, err := os.ReadFile(filepath.Join(bin, b))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(exe, []byte(crashpoint.Env)) {
			t.Errorf("a default build of %s mentions %s", b, crashpoint.Env)
		}
	}
	// A database name that does not exist yet: the demo's migrate creates it.
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := map[string]string{"DATABASE_URL": url}
	var out, errOut bytes.Buffer
	args := []string{"demo", "-bin", bin, "-n", "300", "-fail-rate", "0.1", "-withhold-rate", "0.05", "-sms-api-timeout", "300ms", "-console-addr", "127.0.0.1:0"}
	code := run(ctx, args, testkit.EnvMap(env), &out, &errOut)
	t.Log(out.String())
	if code != 0 {
		t.Fatalf("demo exit %d: %s", code, errOut.String())
	}
	s := out.String()
	for _, want := range []string{"console:  http://127.0.0.1:", "(log in as demo, password ", "summary:  300 messages: delivered ",
		"sent (no receipt yet) 0, dead 0, unknown 0; unknown settled by evidence: ", "per key: all 1 (duplicates 0)", "commit-to-accepted p50",
		"what the counts mean:", "responses withheld            requests the stub took and then never answered",
		"intents:  form posted twice, one key: ", "code that expired before it could go: expired, 0 sent", "booking for tomorrow, cancelled: cancelled, 0 sent", "to a number that replied STOP: suppressed, 0 sent"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
}

// docs/configuration.md lists every setting, generated from bind (make docs).
func TestSettingsDoc(t *testing.T) { testkit.SettingsDoc(t, "demo", bind) }

// The demo's console serves plain HTTP with the password it prints, so
// DEMO_CONSOLE_ADDR is this host's loopback only (relay console itself
// refuses plain text elsewhere); a bad value stops the demo naming it.
func TestConsoleAddrStaysOnThisHost(t *testing.T) {
	t.Parallel()
	for addr, ok := range map[string]bool{
		"127.0.0.1:8089": true, "localhost:0": true, "[::1]:8089": true, "": true,
		":8089": false, "0.0.0.0:8089": false, "192.0.2.10:8089": false,
	} {
		var c config
		var errOut bytes.Buffer
		s := envflag.New("demo", testkit.EnvMap(map[string]string{"DEMO_CONSOLE_ADDR": addr}), &errOut)
		bind(s, &c)
		err := s.Parse(nil)
		if (err == nil) != ok {
			t.Errorf("DEMO_CONSOLE_ADDR=%q: %v, want accepted %v", addr, err, ok)
			continue
		}
		if err != nil && !strings.Contains(err.Error(), "DEMO_CONSOLE_ADDR") {
			t.Errorf("DEMO_CONSOLE_ADDR=%q: the error %q does not name it", addr, err)
		}
	}
}
