package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/testing/pgserver"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// The failover drill, short (make drill runs it long, with the defaults'
// timings): a streaming standby promoted after the primary crashed, at a
// provider without idempotency that answers slowly and takes a quarter of
// the messages without answering while calls are in flight across the
// failover. Whatever the old primary took with it, no message reaches a
// phone twice, none the provider delivered ends dead, none is lost.
func TestFailoverDrillShort(t *testing.T) {
	if _, err := pgserver.FindBin(); err != nil {
		t.Skipf("no PostgreSQL server binaries to make a primary and a standby: %v", err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-tags", crashpoint.Tag, "-o", bin+"/", "../../cmd/relay", "../../cmd/sender", "../../cmd/smsstub", "../../cmd/receiver")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	args := []string{"soak", "-bin", bin, "-rows", "1500", "-load-duration", "20s", "-drill", "pg-failover", "-drill-short",
		"-provider", "lookup", "-drain-timeout", "4m"}
	code := run(ctx, args, testkit.EnvMap(nil), &out, &errOut)
	t.Log(out.String())
	if code != 0 {
		t.Fatalf("drill exit %d\n%s", code, errOut.String())
	}
	s := out.String()
	for _, want := range []string{"duplicates 0;", "dead but delivered 0;", "wrong fate 0;", "lost 0;", "calls in flight lost their answer"} {
		if !strings.Contains(s, want) {
			t.Errorf("the drill's lines lack %q", want)
		}
	}
}
