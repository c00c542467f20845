package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
)

// A send slower than the consumer's ack deadline keeps its message with
// InProgress heartbeats: no redelivery, one request, the row sent.
// With BackOff set, the server's ack deadline is BackOff[0], not AckWait,
// and the heartbeats follow it.
func TestSlowSendKeepsItsMessage(t *testing.T) {
	t.Parallel()
	t.Run("ack wait", func(t *testing.T) {
		t.Parallel()
		testSlowSend(t, func(c *jetstream.ConsumerConfig) { c.AckWait = 2 * time.Second })
	})
	t.Run("backoff", func(t *testing.T) {
		t.Parallel()
		testSlowSend(t, func(c *jetstream.ConsumerConfig) {
			c.AckWait = time.Minute
			c.BackOff = []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second}
		})
	})
}

func testSlowSend(t *testing.T, consumer func(*jetstream.ConsumerConfig)) {
	// The call outlasts the 2 s ack deadline more than twice over.
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{Latency: 5 * time.Second}}})
	e.updateConsumer(consumer)
	e.startRelay(relay.Config{})
	reg := prometheus.NewRegistry()
	e.startSender(senderOptions{timeout: 10 * time.Second, cfg: sender.Config{Registerer: reg}})
	ids := e.insert(3)
	rows := e.waitTerminal(ids, time.Minute)
	for _, id := range ids {
		r := rows[id]
		if r.status != outbox.StatusSent || r.attempts != 1 {
			t.Errorf("row = %+v, want sent on the first attempt", r)
		}
		if d := e.stub.Deliveries()[id.String()]; d.Requests != 1 {
			t.Errorf("provider got %d requests for %s, want 1", d.Requests, id)
		}
	}
	if n := counterValue(t, reg, "sendonce_sender_redeliveries_total"); n != 0 {
		t.Fatalf("%v redeliveries: the heartbeats did not hold the messages", n)
	}
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// A connection reset after the provider accepted (toxiproxy reset_peer on
// the response path): retried with the same key, one delivery.
func TestResetAfterAcceptIsSentOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	proxy := e.newProxy()
	proxy.Add("reset", "reset_peer", "downstream", map[string]any{"timeout": 0})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{baseURL: proxy.URL(), timeout: 2 * time.Second})
	ids := e.insert(1)
	e.setBudget(ids, 100)
	testkit.WaitFor(t, 30*time.Second, "the provider to accept", func() bool { return e.stub.Deliveries()[ids[0].String()].Deliveries == 1 })
	testkit.WaitFor(t, 30*time.Second, "a retry after the reset", func() bool { return e.row(ids[0]).attempts >= 2 })
	proxy.Remove("reset")
	rows := e.waitTerminal(ids, 30*time.Second)
	if r := rows[ids[0]]; r.status != outbox.StatusSent {
		t.Fatalf("row = %+v, want sent", r)
	}
	e.checkOnce(ids, rows)
}

// A provider without idempotency that loses the response after accepting:
// the row ends unknown with an ambiguous dead letter, never a second call.
func TestLostResponseAtNonIdempotentProviderEndsUnknown(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
	proxy := e.newProxy()
	proxy.Add("lose_responses", "timeout", "downstream", map[string]any{"timeout": 0})
	e.startRelay(relay.Config{})
	no := false
	e.startSender(senderOptions{baseURL: proxy.URL(), timeout: 300 * time.Millisecond, idempotent: &no})
	ids := e.insert(1)
	rows := e.waitTerminal(ids, 30*time.Second)
	if r := rows[ids[0]]; r.status != outbox.StatusUnknown || r.attempts != 1 {
		t.Fatalf("row = %+v, want unknown after one attempt", r)
	}
	// The proxy may hand the request on after the sender gave up on it.
	testkit.WaitFor(t, 30*time.Second, "the request at the provider", func() bool { return e.stub.Deliveries()[ids[0].String()].Requests >= 1 })
	if d := e.stub.Deliveries()[ids[0].String()]; d.Requests != 1 {
		t.Fatalf("provider got %d requests, want 1", d.Requests)
	}
	dl := deadLetterFor(e.lettersOf(ids[:1], 30*time.Second), ids[0])
	if len(dl) != 1 || dl[0].Header.Get(wire.HeaderReason) != wire.ReasonAmbiguous {
		t.Fatalf("dead letters = %v", dl)
	}
}

// A provider that took the first attempt and lost its answer, then refuses
// the retry for good (its key was rotated): the row must not end dead, which
// would tell the application the user got nothing. It ends unknown with an
// ambiguous dead letter after exactly two calls.
func TestRefusalAfterALostAnswerEndsUnknown(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	var calls atomic.Int32
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			// Took the message; the answer is lost (connection reset).
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			if tc, ok := conn.(interface{ SetLinger(int) error }); ok {
				_ = tc.SetLinger(0)
			}
			_ = conn.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"code":20003,"message":"authentication failed"}`))
	}))
	t.Cleanup(p.Close)
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{baseURL: p.URL, timeout: 2 * time.Second})
	ids := e.insert(1)
	rows := e.waitTerminal(ids, 30*time.Second)
	if r := rows[ids[0]]; r.status != outbox.StatusUnknown || r.attempts != 2 {
		t.Fatalf("row = %+v, want unknown after 2 attempts", r)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("provider called %d times, want 2", n)
	}
	dl := deadLetterFor(e.lettersOf(ids[:1], 30*time.Second), ids[0])
	if len(dl) != 1 || dl[0].Header.Get(wire.HeaderReason) != wire.ReasonAmbiguous {
		t.Fatalf("dead letters = %v, want one with reason ambiguous", dl)
	}
}

// A 429 with Retry-After: no call for the key before it elapses.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{RateLimitRate: 1, RetryAfter: 2 * time.Second}}})
	// The stub's own times of each request per key are what is checked.
	var mu sync.Mutex
	seen := map[string][]time.Time{}
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("Idempotency-Key")] = append(seen[r.Header.Get("Idempotency-Key")], time.Now())
		n := len(seen[r.Header.Get("Idempotency-Key")])
		mu.Unlock()
		if n == 2 {
			_ = e.stub.SetFaults(smsstub.Faults{}) // the limiter opens
		}
		e.stub.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(rec.Close)
	e.startRelay(relay.Config{})
	// A tiny backoff: only Retry-After can make the sender wait.
	e.startSender(senderOptions{baseURL: rec.URL, cfg: sender.Config{RetryBase: time.Millisecond, RetryCap: 5 * time.Millisecond}})
	ids := e.insert(1)
	rows := e.waitTerminal(ids, time.Minute)
	if r := rows[ids[0]]; r.status != outbox.StatusSent {
		t.Fatalf("row = %+v", r)
	}
	mu.Lock()
	times := seen[ids[0].String()]
	mu.Unlock()
	if len(times) < 2 {
		t.Fatalf("%d requests", len(times))
	}
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap < 2*time.Second {
			t.Fatalf("request %d came %s after a 429 with Retry-After: 2", i+1, gap)
		}
	}
}

// Every attempt is logged with its outcome class, status and code; never
// the body or the number.
func TestAttemptsAreLogged(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{FailRate: 1, FailStatus: 503, FailCode: 30001}}})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	ids := e.insert(1)
	e.setBudget(ids, 100)
	// Counted at the stub, where the fault is drawn: the row's count rises
	// at the claim, before the call.
	testkit.WaitFor(t, 30*time.Second, "two failed attempts", func() bool { return e.stub.Deliveries()[ids[0].String()].Requests >= 2 })
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.waitTerminal(ids, 30*time.Second)
	attempts, err := outbox.Attempts(context.Background(), e.pool, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) < 3 {
		t.Fatalf("%d attempts logged, want at least 3", len(attempts))
	}
	for i, a := range attempts[:len(attempts)-1] {
		if a.Outcome != "retry" || a.HTTPStatus != 503 || a.ProviderCode != 30001 || a.Number != i+1 || a.Latency <= 0 || a.Sender == "" {
			t.Errorf("attempt %d = %+v", i+1, a)
		}
	}
	if last := attempts[len(attempts)-1]; last.Outcome != "sent" || last.HTTPStatus != 201 {
		t.Errorf("last attempt = %+v", last)
	}
	var leaked int
	_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_attempts a JOIN sms_outbox o ON o.id = a.outbox_id
		WHERE a.error LIKE '%' || o.to_e164 || '%' OR a.error LIKE '%' || o.body || '%'`).Scan(&leaked)
	if leaked != 0 {
		t.Fatalf("%d attempts log a number or a body", leaked)
	}
}

// twilioStub is a provider of Twilio's shape: form-encoded, basic auth, no
// idempotency, its error JSON; it counts deliveries per To+Body.
type twilioStub struct {
	mu         sync.Mutex
	deliveries map[string]int
	status     atomic.Int32 // 0: accept; else answer with this status
	code       atomic.Int32
}

func (s *twilioStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/2010-04-01/Accounts/AC123/Messages.json" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	user, pass, ok := r.BasicAuth()
	if !ok || user != "AC123" || pass != "twilio-token-9z" {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"code":20003,"message":"Authenticate","more_info":"https://www.twilio.com/docs/errors/20003","status":401}`))
		return
	}
	if err := r.ParseForm(); err != nil || r.PostForm.Get("From") != "+15550001111" {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"code":21603,"message":"A 'From' phone number is required.","status":400}`))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if st := int(s.status.Load()); st != 0 {
		w.WriteHeader(st)
		fmt.Fprintf(w, `{"code":%d,"message":"The 'To' number %s is not valid.","more_info":"x","status":%d}`, s.code.Load(), r.PostForm.Get("To"), st)
		return
	}
	s.mu.Lock()
	s.deliveries[r.PostForm.Get("To")+"|"+r.PostForm.Get("Body")]++
	n := len(s.deliveries)
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"sid": fmt.Sprintf("SM%032d", n), "status": "queued", "to": r.PostForm.Get("To")})
}

func TestTwilioAdapter(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	tw := &twilioStub{deliveries: map[string]int{}}
	hs := httptest.NewServer(tw)
	t.Cleanup(hs.Close)
	prov, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: hs.URL, AccountSID: "AC123", AuthToken: "twilio-token-9z", From: "+15550001111", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if prov.Idempotent() {
		t.Fatal("the Twilio adapter claims idempotency")
	}
	_, js := e.nats.Connect(t)
	s, err := sender.New(sender.Config{Pool: e.pool, JetStream: js, Provider: prov, Logger: e.logger(), RetryBase: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.background("twilio sender", s.Run)
	e.startRelay(relay.Config{})

	ids := e.insert(20)
	rows := e.waitTerminal(ids, time.Minute)
	tw.mu.Lock()
	for k, n := range tw.deliveries {
		if n != 1 {
			t.Errorf("delivery %q counted %d times", k, n)
		}
	}
	if len(tw.deliveries) != len(ids) {
		t.Errorf("%d deliveries, want %d", len(tw.deliveries), len(ids))
	}
	tw.mu.Unlock()
	for _, id := range ids {
		if r := rows[id]; r.status != outbox.StatusSent || len(r.ref) != 34 {
			t.Errorf("row = %+v, want sent with a Twilio SID", r)
		}
	}

	// A 5xx from a provider without idempotency is ambiguous: unknown.
	tw.status.Store(500)
	tw.code.Store(20500)
	five := e.insert(1)
	if r := e.waitTerminal(five, time.Minute)[five[0]]; r.status != outbox.StatusUnknown {
		t.Errorf("after a 500: %+v, want unknown", r)
	}
	// A permanent code: dead, and the number Twilio echoes is not kept.
	tw.status.Store(400)
	tw.code.Store(21211)
	bad := e.insert(1)
	r := e.waitTerminal(bad, time.Minute)[bad[0]]
	if r.status != outbox.StatusDead {
		t.Errorf("after 21211: %+v, want dead", r)
	}
	var to string
	_ = e.pool.QueryRow(context.Background(), `SELECT to_e164 FROM sms_outbox WHERE id = $1`, bad[0]).Scan(&to)
	if to == "" || strings.Contains(r.lastErr, to) {
		t.Errorf("last_error %q keeps the number", r.lastErr)
	}
	// 429 is not ambiguous even here: the request was refused unprocessed,
	// retried, and spends no attempt.
	tw.status.Store(429)
	tw.code.Store(20429)
	limited := e.insert(1)
	testkit.WaitFor(t, 30*time.Second, "retries after 429", func() bool {
		var n int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_attempts WHERE outbox_id = $1 AND outcome = 'rate_limited'`, limited[0]).Scan(&n)
		return err == nil && n >= 2
	})
	tw.status.Store(0)
	if r := e.waitTerminal(limited, time.Minute)[limited[0]]; r.status != outbox.StatusSent || r.attempts != 1 {
		t.Errorf("after 429s: %+v, want sent on its one attempt", r)
	}
}
