package crashpoint_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv("CRASHPOINT_TEST_CHILD") != "" {
		// The child: hit an armed point, and say so if still alive.
		crashpoint.Hit(crashpoint.SenderAfterAccept)
		os.Stdout.WriteString("survived\n")
		os.Exit(0)
	}
	testkit.Main(m)
}

// A default build ignores SENDONCE_CRASHPOINTS: the same point that kills
// a tagged build at its first hit does nothing. (go test -tags
// sendonce_crashpoints ./internal/crashpoint runs the tagged half.)
func TestTheVariableArmsOnlyATaggedBuild(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CRASHPOINT_TEST_CHILD=1", crashpoint.Env+"="+crashpoint.SenderAfterAccept+"=1")
	out, err := cmd.Output()
	if !crashpoint.Enabled {
		if err != nil || strings.TrimSpace(string(out)) != "survived" {
			t.Fatalf("a default build hit an armed point: %v, output %q", err, out)
		}
		return
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("a tagged build survived an armed point: %v, output %q", err, out)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("a tagged build ended %v, want SIGKILL", exit)
	}
}
