package sendonce_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// deps lists the packages pkgs import, directly or not, as go list sees
// them in this module.
func deps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %v: %v\n%s", pkgs, err, out)
	}
	return strings.Fields(string(out))
}

const mod = "github.com/sendonce/sendonce/"

// testInfrastructure are the packages for tests and the development
// commands (docs/architecture.md).
var testInfrastructure = []string{"pgtest", "natstest", "embednats", "natscluster", "testkit", "testport", "toxictest",
	"pgserver", "pgbouncer", "browsertest", "nodetools", "smsstub"}

// The rules of docs/architecture.md hold: what users run imports no test
// infrastructure, the relay and the sender never import each other, and
// the public outbox package imports nothing internal.
func TestTheProductImportsNoTestInfrastructure(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"./cmd/relay", "./cmd/sender", "./cmd/receiver"} {
		for _, d := range deps(t, cmd) {
			if name, ok := strings.CutPrefix(d, mod+"internal/"); ok && slices.Contains(testInfrastructure, name) {
				t.Errorf("%s imports %s, a package for tests", cmd, d)
			}
		}
	}
	for pkg, other := range map[string]string{"./internal/relay": mod + "internal/sender", "./internal/sender": mod + "internal/relay"} {
		if slices.Contains(deps(t, pkg), other) {
			t.Errorf("%s imports %s: the relay and the sender meet only in Postgres and on the subjects", pkg, other)
		}
	}
	for _, d := range deps(t, "./outbox") {
		if strings.HasPrefix(d, mod+"internal/") {
			t.Errorf("the public outbox package imports %s", d)
		}
	}
}
