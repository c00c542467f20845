package main

import (
	"context"
	"strings"
	"testing"

	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/natstest"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testkit"
)

// relay setup creates the whole topology on an empty broker, the dead
// letters protected from deletes and purges, and a second run changes
// nothing and succeeds.
func TestSetupCreatesTheTopology(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	env := testkit.EnvMap(map[string]string{"NATS_URL": srv.URL(), "LOG_FORMAT": "text"})
	for i := range 2 {
		var out, errOut strings.Builder
		if code := run(context.Background(), []string{"relay", "setup"}, env, &out, &errOut); code != 0 {
			t.Fatalf("run %d: exit %d: %s", i+1, code, errOut.String())
		}
		if i == 1 && strings.Contains(errOut.String(), "change=") {
			t.Fatalf("a second setup changed the topology:\n%s", errOut.String())
		}
	}
	_, js := srv.Connect(t)
	ctx := context.Background()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	if missing, err := topo.Verify(ctx, js); err != nil || len(missing) > 0 {
		t.Fatalf("after setup: %v %v", missing, err)
	}
	if _, err := js.KeyValue(ctx, flow.DefaultBucket); err != nil {
		t.Fatalf("flow bucket: %v", err)
	}
	dlq, err := js.Stream(ctx, streams.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := dlq.CachedInfo().Config; !cfg.DenyDelete || !cfg.DenyPurge {
		t.Fatalf("SMS_DLQ deny_delete=%v deny_purge=%v, want both", cfg.DenyDelete, cfg.DenyPurge)
	}
}
