package outbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/outbox"
)

// An application module outside this repository imports the package and
// enqueues a message: examples/app, copied to a directory of its own with
// its replace directive pointed back here, is built and run against the
// test database.
func TestApplicationModuleEnqueues(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(root, "examples", "app", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// -mod=mod with the committed go.sum: no network unless the app's
	// requirements fell behind the repository's, which the module proxy
	// then fills in (in the copy only).
	// As a user builds it: go.sum must already hold what it needs.
	goEnv := append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, goEnv
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	run("go", "mod", "edit", "-replace", "github.com/sendonce/sendonce="+root)
	run("go", "build", "-o", "app", ".")

	cmd := exec.Command(filepath.Join(dir, "app"), "-to", "+15557654321", "-body", "hello from another module")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+os.Getenv("DATABASE_URL"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("app: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`^enqueued ([0-9a-f-]{36}): pending\nfollow it: relay trace ([0-9a-f-]{36})\n$`).FindStringSubmatch(string(out))
	if m != nil && m[1] != m[2] {
		m = nil
	}
	if m == nil {
		t.Fatalf("app printed %q", out)
	}
	st, err := outbox.Status(context.Background(), db, uuid.MustParse(m[1]))
	if err != nil || st.Status != outbox.StatusPending {
		t.Fatalf("the app's message: %+v, %v", st, err)
	}
}
