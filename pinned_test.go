package sendonce_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The Dockerfile builds with the Go patch release go.mod pins, so the
// standard library scripts/govulncheck.sh checks is the one the image ships.
func TestDockerfileGoMatchesToolchain(t *testing.T) {
	t.Parallel()
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^toolchain go(\d+\.\d+\.\d+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no toolchain line pinning a Go patch release (go1.N.P)")
	}
	want := string(m[1])
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	froms := regexp.MustCompile(`(?m)^FROM\s+(\S*golang:\S+)`).FindAllSubmatch(df, -1)
	if len(froms) == 0 {
		t.Fatal("the Dockerfile has no golang build stage")
	}
	for _, f := range froms {
		image := string(f[1])
		tag := strings.SplitN(strings.SplitN(image, ":", 2)[1], "@", 2)[0]
		if !strings.HasPrefix(tag, want+"-") && tag != want {
			t.Errorf("Dockerfile builds with %s; go.mod pins toolchain go%s", image, want)
		}
	}
}
