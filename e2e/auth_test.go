package e2e

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/natstest"
	"github.com/sendonce/sendonce/internal/pgtest"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testkit"
	"github.com/sendonce/sendonce/outbox"
)

// The permission sets a deployment gives each component: exactly the
// subjects it publishes to and the JetStream API calls it makes.
var (
	relayPermissions = &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			"sms.send", "sms.send.>", "sms.dlq",
			"$JS.API.INFO",
			"$JS.API.STREAM.CREATE.SMS", "$JS.API.STREAM.UPDATE.SMS", "$JS.API.STREAM.INFO.SMS",
			"$JS.API.STREAM.CREATE.SMS_DLQ", "$JS.API.STREAM.UPDATE.SMS_DLQ", "$JS.API.STREAM.INFO.SMS_DLQ",
			"$JS.API.CONSUMER.CREATE.SMS.senders", "$JS.API.CONSUMER.CREATE.SMS.senders.>",
			"$JS.API.CONSUMER.CREATE.SMS.senders_urgent", "$JS.API.CONSUMER.CREATE.SMS.senders_urgent.>",
			"$JS.API.CONSUMER.CREATE.SMS.senders_bulk", "$JS.API.CONSUMER.CREATE.SMS.senders_bulk.>",
			"$JS.API.CONSUMER.INFO.SMS.senders", "$JS.API.CONSUMER.INFO.SMS.senders_urgent", "$JS.API.CONSUMER.INFO.SMS.senders_bulk",
			"$JS.API.STREAM.CREATE.KV_sendonce_flow", "$JS.API.STREAM.INFO.KV_sendonce_flow",
		}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
	senderPermissions = &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			"sms.dlq",
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO.SMS", "$JS.API.STREAM.INFO.SMS_DLQ",
			"$JS.API.CONSUMER.INFO.SMS.senders", "$JS.API.CONSUMER.MSG.NEXT.SMS.senders", "$JS.ACK.SMS.senders.>",
			"$JS.API.CONSUMER.INFO.SMS.senders_urgent", "$JS.API.CONSUMER.MSG.NEXT.SMS.senders_urgent", "$JS.ACK.SMS.senders_urgent.>",
			"$JS.API.CONSUMER.INFO.SMS.senders_bulk", "$JS.API.CONSUMER.MSG.NEXT.SMS.senders_bulk", "$JS.ACK.SMS.senders_bulk.>",
			// The shared flow state: heartbeats and pauses, and a watch.
			"$KV.sendonce_flow.>", "$JS.API.STREAM.INFO.KV_sendonce_flow",
			"$JS.API.CONSUMER.CREATE.KV_sendonce_flow.>", "$JS.API.CONSUMER.DELETE.KV_sendonce_flow.>",
		}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
)

// Both components work under least-privilege users, a forbidden action is
// refused by the server, and wrong credentials stop start-up with an error
// naming the setting.
func TestLeastPrivilegeNATSUsers(t *testing.T) {
	t.Parallel()
	srv := natstest.StartWith(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "relay", Password: "relay-pw-1", Permissions: relayPermissions},
			{Username: "sender", Password: "sender-pw-2", Permissions: senderPermissions},
		}
	})
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

	// Wrong credentials: fast failure naming the settings to check.
	bad := startProcess(t, "relay", append(base, "NATS_USER=relay", "NATS_PASSWORD=wrong"))
	if err := bad.waitExit(t, 30*time.Second); err == nil || !strings.Contains(bad.logs.String(), "NATS_USER/NATS_PASSWORD") {
		t.Fatalf("wrong password: exit %v, logs %s", err, bad.logs.String())
	}

	startProcess(t, "relay", append(base, "NATS_USER=relay", "NATS_PASSWORD=relay-pw-1"))
	admin := func() jetstream.JetStream {
		_, js := srv.Connect(t, nats.UserInfo("relay", "relay-pw-1"))
		return js
	}()
	testkit.WaitFor(t, 30*time.Second, "the relay to create the streams", func() bool {
		_, err := admin.Consumer(context.Background(), streams.Stream, streams.Consumer)
		return err == nil
	})
	snd := startProcess(t, "sender", append(base, "NATS_USER=sender", "NATS_PASSWORD=sender-pw-2", "NATS_ENSURE_TOPOLOGY=false",
		"SMS_RATE_LIMIT=1000"))
	ids := insertVia(t, pool, 50)
	final := waitAllTerminal(t, pool, len(ids), time.Minute)
	for _, id := range ids {
		if final[id.String()] != outbox.StatusSent {
			t.Fatalf("row %s ended %s under least-privilege users", id, final[id.String()])
		}
	}
	// The shared rate limit works under the sender's permissions: its flow
	// state was reachable, not a fallback.
	if logs := snd.logs.String(); strings.Contains(logs, "unreachable") || strings.Contains(logs, "Permissions Violation") {
		t.Fatalf("the sender could not use the shared flow state under its permissions:\n%s", logs)
	}

	// Forbidden actions are refused: the sender cannot publish work, the
	// relay cannot consume it.
	for _, c := range []struct{ user, pass, subject string }{
		{"sender", "sender-pw-2", "sms.send"},
		{"relay", "relay-pw-1", "$JS.API.CONSUMER.MSG.NEXT.SMS.senders"},
		{"sender", "sender-pw-2", "$JS.API.STREAM.DELETE.SMS"},
	} {
		var mu sync.Mutex
		var got error
		nc, err := nats.Connect(srv.URL(), nats.UserInfo(c.user, c.pass), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			got = err
			mu.Unlock()
		}))
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.Publish(c.subject, []byte("{}"))
		_ = nc.Flush()
		testkit.WaitFor(t, 10*time.Second, "a permissions violation for "+c.user+" on "+c.subject, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return got != nil && errors.Is(got, nats.ErrPermissionViolation)
		})
		nc.Close()
	}
}
