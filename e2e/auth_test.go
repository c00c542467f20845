package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/outbox"
)

// deployedNATSUsers loads the users and permission sets of the deployment
// (deploy/nats/auth.conf, through the nats.conf compose runs), each with
// the password "pw-" + its name.
func deployedNATSUsers(t *testing.T) []*server.User {
	t.Helper()
	users := natstest.DeployedUsers(t, "../deploy/nats/nats.conf")
	if len(users) != 4 {
		t.Fatalf("deploy/nats: %d users, want admin, relay, sender and operator", len(users))
	}
	return users
}

// The deployment's least-privilege users: relay setup as admin creates the
// topology, the relay and the senders run the pipeline with
// NATS_ENSURE_TOPOLOGY=false and their own inbox prefixes, the operator
// reads the dead letters, and what each may not do is refused: the relay
// cannot change, delete or purge SMS_DLQ nor redefine the consumer, and no
// one deletes or purges the dead letters. Wrong credentials stop start-up
// with an error naming the setting.
func TestLeastPrivilegeNATSUsers(t *testing.T) {
	srv := natstest.StartWith(t, func(o *server.Options) { o.Users = deployedNATSUsers(t) })
	url := pgtest.NewMigrated(t)
	pool := newPool(t, url)
	stub, err := smsstub.New(smsstub.Config{APIKey: testAPIKey})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	t.Cleanup(hs.Close)
	base := []string{"DATABASE_URL=" + url, "NATS_URL=" + srv.URL(), "HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=debug",
		"SMS_API_BASE=" + hs.URL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY=" + testAPIKey, "RELAY_POLL_INTERVAL=100ms"}
	as := func(user string) []string {
		return append(base, "NATS_USER="+user, "NATS_PASSWORD=pw-"+user, "NATS_INBOX_PREFIX=_INBOX_"+user)
	}

	// Wrong credentials: fast failure naming the settings to check.
	bad := startProcess(t, "relay", append(base, "NATS_USER=relay", "NATS_PASSWORD=wrong"))
	if err := bad.waitExit(t, 30*time.Second); err == nil || !strings.Contains(bad.logs.String(), "NATS_USER/NATS_PASSWORD") {
		t.Fatalf("wrong password: exit %v, logs %s", err, bad.logs.String())
	}

	setup := startProcess(t, "relay", as("admin"), "setup")
	if err := setup.waitExit(t, time.Minute); err != nil {
		t.Fatalf("relay setup as admin: %v\n%s", err, setup.logs.String())
	}

	rly := startProcess(t, "relay", append(as("relay"), "NATS_ENSURE_TOPOLOGY=false"))
	snd := startProcess(t, "sender", append(as("sender"), "NATS_ENSURE_TOPOLOGY=false", "SMS_RATE_LIMIT=1000"))
	ids := insertVia(t, pool, 50)
	final := waitAllTerminal(t, pool, len(ids), time.Minute)
	for _, id := range ids {
		if final[id.String()] != outbox.StatusSent {
			t.Fatalf("row %s ended %s under least-privilege users", id, final[id.String()])
		}
	}
	// The shared rate limit works under the sender's permissions: its flow
	// state was reachable, not a fallback; neither process was refused.
	for _, p := range []*process{rly, snd} {
		if logs := p.logs.String(); strings.Contains(logs, "unreachable") || strings.Contains(logs, "Permissions Violation") {
			t.Fatalf("%s was refused something under its permissions:\n%s", p.Name(), logs)
		}
	}

	// The operator reads the dead letters.
	_, relayJS := connectAs(t, srv, "relay")
	if _, err := relayJS.Publish(context.Background(), "sms.dlq", []byte(`{}`)); err != nil {
		t.Fatalf("the relay dead-letters: %v", err)
	}
	list := startProcess(t, "relay", as("operator"), "dlq", "list")
	if err := list.waitExit(t, time.Minute); err != nil {
		t.Fatalf("relay dlq list as operator: %v\n%s", err, list.logs.String())
	}

	// Refused to the relay: SMS_DLQ's config (a short max_age would wipe
	// the dead letters), its deletion, a purge, a message delete, and
	// redefining the consumer.
	_, adminJS := connectAs(t, srv, "admin")
	ctx := context.Background()
	dlqBefore, err := adminJS.Stream(ctx, streams.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	consBefore, err := adminJS.Consumer(ctx, streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(who, what string, call func(ctx context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if err := call(cctx); err == nil {
			t.Errorf("%s may %s", who, what)
		}
	}
	short := dlqBefore.CachedInfo().Config
	short.MaxAge = time.Second
	refused("relay", "update SMS_DLQ", func(ctx context.Context) error { _, err := relayJS.UpdateStream(ctx, short); return err })
	refused("relay", "delete SMS_DLQ", func(ctx context.Context) error { return relayJS.DeleteStream(ctx, streams.DeadLetterStream) })
	refused("relay", "purge SMS_DLQ", func(ctx context.Context) error {
		s, err := relayJS.Stream(ctx, streams.DeadLetterStream)
		if err != nil {
			return err
		}
		return s.Purge(ctx)
	})
	redefined := consBefore.CachedInfo().Config
	redefined.AckWait = time.Second
	redefined.MaxDeliver = 1
	refused("relay", "redefine the consumer", func(ctx context.Context) error {
		_, err := relayJS.UpdateConsumer(ctx, streams.Stream, redefined)
		return err
	})
	refused("relay", "create a consumer", func(ctx context.Context) error {
		_, err := relayJS.CreateConsumer(ctx, streams.Stream, jetstream.ConsumerConfig{Durable: "thief"})
		return err
	})
	// Not even admin deletes or purges dead letters: its permissions and
	// the stream's deny_delete and deny_purge refuse it.
	refused("admin", "purge SMS_DLQ", func(ctx context.Context) error {
		s, err := adminJS.Stream(ctx, streams.DeadLetterStream)
		if err != nil {
			return err
		}
		return s.Purge(ctx)
	})
	refused("admin", "delete a dead letter", func(ctx context.Context) error {
		s, err := adminJS.Stream(ctx, streams.DeadLetterStream)
		if err != nil {
			return err
		}
		return s.DeleteMsg(ctx, 1)
	})

	// No one but admin creates a consumer: a push consumer delivering on
	// sms.send (nats-server does not check a deliver subject against its
	// creator's permissions) would put dead letters or flow heartbeats
	// to work. Each form of the create request, as the operator on
	// SMS_DLQ and as the sender on the flow bucket and SMS, goes
	// unanswered, and no such consumer exists after.
	smsBefore := streamMsgs(t, adminJS, streams.Stream)
	for _, c := range []struct{ user, stream string }{
		{"operator", streams.DeadLetterStream}, {"sender", "KV_sendonce_flow"}, {"sender", streams.Stream},
	} {
		nc, _ := connectAs(t, srv, c.user)
		for _, subj := range []string{
			"$JS.API.CONSUMER.CREATE." + c.stream,
			"$JS.API.CONSUMER.CREATE." + c.stream + ".hijack",
			"$JS.API.CONSUMER.CREATE." + c.stream + ".hijack.>",
			"$JS.API.CONSUMER.DURABLE.CREATE." + c.stream + ".hijack",
		} {
			req := fmt.Sprintf(`{"stream_name":%q,"config":{"name":"hijack","durable_name":"hijack","deliver_subject":"sms.send","deliver_policy":"all","ack_policy":"none"}}`, c.stream)
			if strings.HasSuffix(subj, ".>") {
				subj = strings.TrimSuffix(subj, ">") + "sms.>" // a filtered create
				req = strings.Replace(req, `"ack_policy"`, `"filter_subject":"sms.>","ack_policy"`, 1)
			}
			if reply, err := nc.Request(subj, []byte(req), 2*time.Second); err == nil {
				t.Errorf("%s may create a push consumer on %s delivering on sms.send (%s): %s", c.user, c.stream, subj, reply.Data)
			}
		}
		if _, err := adminJS.Consumer(ctx, c.stream, "hijack"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("a consumer hijack exists on %s after %s's attempts: %v", c.stream, c.user, err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if after := streamMsgs(t, adminJS, streams.Stream); after != smsBefore {
		t.Errorf("SMS went from %d to %d messages during the consumer attempts", smsBefore, after)
	}
	// The operator's reading needs none: two operators list the dead
	// letters at once.
	var wg sync.WaitGroup
	lists := make([]*process, 2)
	for i := range lists {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lists[i] = startProcess(t, "relay", as("operator"), "dlq", "list")
		}()
	}
	wg.Wait()
	for _, p := range lists {
		if err := p.waitExit(t, time.Minute); err != nil {
			t.Fatalf("relay dlq list as operator, two at once: %v\n%s", err, p.logs.String())
		}
		if logs := p.logs.String(); strings.Contains(logs, "Permissions Violation") {
			t.Fatalf("relay dlq list was refused something:\n%s", logs)
		}
	}

	dlqAfter, err := adminJS.Stream(ctx, streams.DeadLetterStream)
	if err != nil {
		t.Fatalf("SMS_DLQ after the refusals: %v", err)
	}
	if got := dlqAfter.CachedInfo(); got.Config.MaxAge != dlqBefore.CachedInfo().Config.MaxAge || got.State.Msgs == 0 {
		t.Fatalf("SMS_DLQ changed: max_age %s, %d messages", got.Config.MaxAge, got.State.Msgs)
	}
	consAfter, err := adminJS.Consumer(ctx, streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if c := consAfter.CachedInfo().Config; c.AckWait != consBefore.CachedInfo().Config.AckWait || c.MaxDeliver != consBefore.CachedInfo().Config.MaxDeliver {
		t.Fatalf("the consumer was redefined: ack_wait %s, max_deliver %d", c.AckWait, c.MaxDeliver)
	}

	// Outside a user's set the server refuses: the sender cannot publish
	// work, the relay cannot consume it, and no user reads another's
	// replies.
	for _, c := range []struct {
		user, what string
		act        func(nc *nats.Conn)
	}{
		{"sender", "publish sms.send", func(nc *nats.Conn) { _ = nc.Publish("sms.send", []byte("{}")) }},
		{"relay", "fetch from the consumer", func(nc *nats.Conn) { _ = nc.Publish("$JS.API.CONSUMER.MSG.NEXT.SMS.senders", []byte("{}")) }},
		{"sender", "delete SMS", func(nc *nats.Conn) { _ = nc.Publish("$JS.API.STREAM.DELETE.SMS", nil) }},
		{"relay", "update SMS_DLQ", func(nc *nats.Conn) { _ = nc.Publish("$JS.API.STREAM.UPDATE.SMS_DLQ", []byte("{}")) }},
		{"relay", "read the sender's replies", func(nc *nats.Conn) { _, _ = nc.SubscribeSync("_INBOX_sender.>") }},
		{"sender", "read the relay's replies", func(nc *nats.Conn) { _, _ = nc.SubscribeSync("_INBOX_relay.>") }},
		{"operator", "read the default inbox", func(nc *nats.Conn) { _, _ = nc.SubscribeSync("_INBOX.>") }},
	} {
		var mu sync.Mutex
		var got error
		nc, err := nats.Connect(srv.URL(), nats.UserInfo(c.user, "pw-"+c.user), nats.CustomInboxPrefix("_INBOX_"+c.user),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				got = err
				mu.Unlock()
			}))
		if err != nil {
			t.Fatal(err)
		}
		c.act(nc)
		_ = nc.Flush()
		testkit.WaitFor(t, 10*time.Second, "a permissions violation: "+c.user+" may not "+c.what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return got != nil && errors.Is(got, nats.ErrPermissionViolation)
		})
		nc.Close()
	}
}

// streamMsgs is the number of messages stream holds.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// connectAs connects as a deployed user with its inbox prefix.
func connectAs(t *testing.T, srv *natstest.Server, user string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return srv.Connect(t, nats.UserInfo(user, "pw-"+user), nats.CustomInboxPrefix("_INBOX_"+user))
}
