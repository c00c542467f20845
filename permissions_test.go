package sendonce_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
)

// The deployment's relay user (deploy/nats/auth.conf) may publish work
// only on the subjects the senders' consumers read (their filter subjects
// in nats/), and dead letters: a message on another subject of SMS
// (sms.send.4, a lane's typo) would be stored and never delivered, its
// row queued until the reconciler, the stream's room spent. Checked on
// the file, and on a server running it.
func TestRelayPublishesOnlyConsumedSubjects(t *testing.T) {
	users := natstest.DeployedUsers(t, "deploy/nats/nats.conf")
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	var consumed []string
	for _, c := range topo.Consumers[streams.Stream] {
		if c.FilterSubject != "" {
			consumed = append(consumed, c.FilterSubject)
		}
		consumed = append(consumed, c.FilterSubjects...)
	}
	i := slices.IndexFunc(users, func(u *server.User) bool { return u.Username == "relay" })
	if i < 0 || users[i].Permissions == nil || users[i].Permissions.Publish == nil {
		t.Fatal("deploy/nats: no relay user with publish permissions")
	}
	allowed := users[i].Permissions.Publish.Allow
	for _, s := range allowed {
		if strings.HasPrefix(s, streams.SubjectSend) && !slices.Contains(consumed, s) {
			t.Errorf("deploy/nats/auth.conf: the relay may publish %q, which no consumer of %s reads (they read %q)", s, streams.Stream, consumed)
		}
	}
	for _, s := range append(slices.Clone(consumed), streams.SubjectDeadLetter) {
		if !slices.Contains(allowed, s) {
			t.Errorf("deploy/nats/auth.conf: the relay may not publish %q", s)
		}
	}

	srv := natstest.StartWith(t, func(o *server.Options) { o.Users = users })
	_, admin := srv.Connect(t, nats.UserInfo("admin", "pw-admin"), nats.CustomInboxPrefix("_INBOX_admin"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := topo.Ensure(ctx, admin); err != nil {
		t.Fatal(err)
	}
	_, relay := srv.Connect(t, nats.UserInfo("relay", "pw-relay"), nats.CustomInboxPrefix("_INBOX_relay"))
	publish := func(subject string) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := relay.Publish(pctx, subject, []byte(`{}`))
		return err
	}
	for _, s := range append(slices.Clone(consumed), streams.SubjectDeadLetter) {
		if err := publish(s); err != nil {
			t.Errorf("the relay publishes %s: %v", s, err)
		}
	}
	before := streamMsgs(t, admin, streams.Stream)
	// A refused publication goes unanswered until its timeout: at once.
	var wg sync.WaitGroup
	for _, s := range []string{"sms.send.0", "sms.send.4", "sms.send.1.x", "sms.send.urgent"} {
		wg.Go(func() {
			if err := publish(s); err == nil {
				t.Errorf("the relay published %s, which no consumer reads", s)
			}
		})
	}
	wg.Wait()
	if after := streamMsgs(t, admin, streams.Stream); after != before {
		t.Errorf("SMS went from %d to %d messages on subjects no consumer reads", before, after)
	}
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}
