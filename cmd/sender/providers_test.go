package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// Going back from SMS_PROVIDERS=generic,twilio to SMS_PROVIDER=generic: the
// rows that name generic (claimed under the list, then put back to wait)
// are sent by the one provider, once; the rows that name twilio, which no
// sender has now, wait, and the sender counts each time it holds one back.
func TestOneProviderTakesTheRowsThatNameIt(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	stub, err := smsstub.New(smsstub.Config{APIKey: "one-provider-key"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	t.Cleanup(hs.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, provider)
		SELECT gen_random_uuid(), '+1555987' || lpad(i::text, 4, '0'), 'provider list test', CASE WHEN i <= 20 THEN 'generic' ELSE 'twilio' END
		FROM generate_series(1, 25) i`); err != nil {
		t.Fatal(err)
	}
	addr := testport.Addr(t)
	env := map[string]string{
		"DATABASE_URL": url, "NATS_URL": srv.URL(), "HTTP_ADDR": addr,
		"SMS_PROVIDER": "generic", "SMS_API_BASE": hs.URL, "SMS_API_ALLOW_INSECURE": "true", "SMS_API_KEY": "one-provider-key",
		"SMS_API_TIMEOUT": "2s",
	}
	var out, errOut testkit.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"sender"}, testkit.EnvMap(env), &out, &errOut) }()
	_, js := srv.Connect(t)
	testkit.WaitFor(t, 30*time.Second, "the sender to create the stream", func() bool {
		_, err := js.Stream(context.Background(), streams.Stream)
		return err == nil
	})
	r, err := relay.New(relay.Config{Pool: pool, JetStream: js, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- r.Run(rctx) }()
	defer func() { rcancel(); <-rdone }()

	count := func(q string) int {
		var n int
		if err := pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testkit.WaitFor(t, 30*time.Second, "the 20 rows naming generic sent", func() bool {
		return count(`SELECT count(*) FROM sms_outbox WHERE provider = 'generic' AND status = 'sent'`) == 20
	})
	testkit.WaitFor(t, 30*time.Second, "the rows naming twilio held back and counted", func() bool {
		return heldBack(t, addr) >= 5
	})
	if n := count(`SELECT count(*) FROM sms_outbox WHERE provider = 'twilio' AND status IN ('pending', 'queued', 'sending') AND attempt_count = 0`); n != 5 {
		t.Errorf("%d of the 5 rows naming twilio wait unattempted; want all", n)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for key, d := range stub.Deliveries() {
		if d.Deliveries != 1 {
			t.Errorf("key %s delivered %d times", key, d.Deliveries)
		}
	}
	if n := len(stub.Deliveries()); n != 20 {
		t.Errorf("the provider took %d messages, want the 20 that name it", n)
	}
}

// heldBack reads the sender's count of messages held back for a provider
// it does not have.
func heldBack(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, `sendonce_sender_held_back_total{why="provider_unknown"} `); ok {
			var n float64
			_, _ = fmt.Sscan(rest, &n)
			return int(n)
		}
	}
	return 0
}
