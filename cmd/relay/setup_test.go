package main

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
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

// relay setup with a user that may not manage streams fails, and says so,
// instead of taking the refusals for a busy broker.
func TestSetupRefusedNamesThePermissions(t *testing.T) {
	t.Parallel()
	srv := natstest.StartWith(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "relay", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.INFO", "$JS.API.STREAM.INFO.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}}}
	})
	env := testkit.EnvMap(map[string]string{"NATS_URL": srv.URL(), "NATS_USER": "relay", "NATS_PASSWORD": "pw", "LOG_FORMAT": "text"})
	var out, errOut strings.Builder
	if code := run(context.Background(), []string{"relay", "setup"}, env, &out, &errOut); code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "needs admin credentials") {
		t.Fatalf("the refusal does not name the permissions:\n%s", errOut.String())
	}
}
