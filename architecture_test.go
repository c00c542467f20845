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

// isTestInfrastructure reports whether an import path is a package for
// tests and the development tools (docs/architecture.md): everything
// under internal/testing/, and the provider stand-in.
func isTestInfrastructure(path string) bool {
	return strings.HasPrefix(path, mod+"internal/testing/") || path == mod+"internal/smsstub"
}

// The rules of docs/architecture.md hold: what users run imports no test
// infrastructure, the relay and the sender never import each other, and
// the public outbox package imports nothing internal.
func TestTheProductImportsNoTestInfrastructure(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"./cmd/relay", "./cmd/sender", "./cmd/receiver"} {
		for _, d := range deps(t, cmd) {
			if isTestInfrastructure(d) {
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
