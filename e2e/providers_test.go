package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/breaker"
	store "github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

// startStub starts a second provider stub, beside the env's.
func (e *env) startStub() (*smsstub.Server, string) {
	e.t.Helper()
	stub, err := smsstub.New(smsstub.Config{APIKey: testAPIKey})
	if err != nil {
		e.t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	e.t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		_ = stub.Close()
	})
	return stub, hs.URL
}

// route is a provider without idempotency (the strict case: a second call
// of a message it took sends it twice), with a fast circuit.
func (e *env) route(name, base string, timeout time.Duration) sender.Route {
	e.t.Helper()
	p, err := provider.New(provider.Config{BaseURL: base, APIKey: testAPIKey, Timeout: timeout})
	if err != nil {
		e.t.Fatal(err)
	}
	return sender.Route{Name: name, Provider: p,
		Breaker: breaker.New(breaker.Config{Failures: 3, OpenFor: 300 * time.Millisecond, MaxOpenFor: 300 * time.Millisecond})}
}

// providerOf returns each row's provider.
func (e *env) providerOf(ids []uuid.UUID) map[uuid.UUID]string {
	e.t.Helper()
	out := map[uuid.UUID]string{}
	rows, err := e.pool.Query(context.Background(), `SELECT id, coalesce(provider, '') FROM sms_outbox WHERE id = ANY($1)`, ids)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var p string
		if err := rows.Scan(&id, &p); err != nil {
			e.t.Fatal(err)
		}
		out[id] = p
	}
	return out
}

// A primary that refuses connections takes nothing: every message goes
// out once through the secondary, and each row names it. When the primary
// is back, its circuit's probe passes and new messages go to it again.
func TestFailoverWhenThePrimaryRefusesConnections(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	proxy := e.newProxy() // the primary: the env's stub behind a proxy
	proxy.Disable()       // refusing connections
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	stop := e.startSender(senderOptions{cfg: sender.Config{Routes: []sender.Route{
		e.route("primary", proxy.URL(), 2*time.Second), e.route("secondary", secondaryURL, 2*time.Second)}}})
	defer stop()

	ids := e.insert(200)
	rows := e.waitTerminal(ids, 60*time.Second)
	at := e.providerOf(ids)
	got := secondary.Deliveries()
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent || got[id.String()].Deliveries != 1 || at[id] != "secondary" {
			t.Errorf("row %s: %s, %d deliveries at the secondary, provider %q; want sent once there, named",
				id, rows[id].status, got[id.String()].Deliveries, at[id])
		}
	}
	if n := len(e.stub.Deliveries()); n != 0 {
		t.Errorf("the refusing primary delivered %d messages", n)
	}

	// The primary recovers: after its open time a probe passes, and new
	// messages go to it.
	proxy.Enable()
	deadline := time.Now().Add(30 * time.Second)
	for len(e.stub.Deliveries()) == 0 && time.Now().Before(deadline) {
		more := e.insert(10)
		e.waitTerminal(more, 30*time.Second)
		ids = append(ids, more...)
	}
	later := e.insert(100)
	e.waitTerminal(later, 60*time.Second)
	ids = append(ids, later...)
	at = e.providerOf(later)
	primary := 0
	for _, id := range later {
		if at[id] == "primary" {
			primary++
		}
	}
	if primary < len(later)*9/10 {
		t.Errorf("after the primary recovered, %d of %d new messages went to it; want nearly all", primary, len(later))
	}
	// Once, across both providers.
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	for _, id := range ids {
		if n := a[id.String()].Deliveries + b[id.String()].Deliveries; n != 1 {
			t.Errorf("row %s delivered %d times across both providers", id, n)
		}
	}
}

// A primary that takes messages and loses its answers may have them: those
// rows stay with it (unknown, without lookups) and never reach the
// secondary; its circuit opens on the silence, and the messages after that
// go to the secondary, once each.
func TestLostAnswersNeverReachTheSecondary(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	proxy := e.newProxy()
	proxy.Add("lose_responses", "timeout", "downstream", map[string]any{"timeout": 0})
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	stop := e.startSender(senderOptions{cfg: sender.Config{Concurrency: 4, Routes: []sender.Route{
		e.route("primary", proxy.URL(), 300*time.Millisecond), e.route("secondary", secondaryURL, 2*time.Second)}}})
	defer stop()

	ids := e.insert(100)
	rows := e.waitTerminal(ids, 60*time.Second)
	at := e.providerOf(ids)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	lost, moved := 0, 0
	for _, id := range ids {
		k := id.String()
		switch {
		case a[k].Deliveries > 0 && b[k].Deliveries > 0:
			t.Errorf("row %s reached both providers", id)
		case a[k].Deliveries > 1 || b[k].Deliveries > 1:
			t.Errorf("row %s delivered more than once", id)
		case a[k].Deliveries == 1:
			lost++
			if rows[id].status != outbox.StatusUnknown || at[id] != "primary" {
				t.Errorf("row %s, taken by the primary with its answer lost: %s at %q; want unknown at primary", id, rows[id].status, at[id])
			}
		case b[k].Deliveries == 1:
			moved++
			if rows[id].status != outbox.StatusSent || at[id] != "secondary" {
				t.Errorf("row %s, sent by the secondary: %s at %q", id, rows[id].status, at[id])
			}
		default:
			t.Errorf("row %s (%s) reached no provider", id, rows[id].status)
		}
	}
	if lost == 0 || moved == 0 {
		t.Errorf("%d rows lost their answer at the primary, %d went to the secondary; want some of each", lost, moved)
	}
	t.Logf("%d rows stayed with the silent primary (unknown), %d went to the secondary", lost, moved)
}

// A lane may prefer a provider: urgent messages go to it while the others
// go to the first of the list.
func TestALanePrefersItsProvider(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	stop := e.startSender(senderOptions{cfg: sender.Config{
		Routes:        []sender.Route{e.route("primary", e.stubURL, 2*time.Second), e.route("secondary", secondaryURL, 2*time.Second)},
		LaneProviders: map[string]string{"urgent": "secondary"},
	}})
	defer stop()

	urgent := e.insertWith(outbox.Urgent, 0, 50)
	normal := e.insertWith(outbox.Normal, 50, 50)
	e.waitTerminal(append(append([]uuid.UUID{}, urgent...), normal...), 60*time.Second)
	at := e.providerOf(append(append([]uuid.UUID{}, urgent...), normal...))
	for _, id := range urgent {
		if at[id] != "secondary" || secondary.Deliveries()[id.String()].Deliveries != 1 {
			t.Errorf("urgent row %s went to %q; want the secondary, which its lane prefers", id, at[id])
		}
	}
	for _, id := range normal {
		if at[id] != "primary" || e.stub.Deliveries()[id.String()].Deliveries != 1 {
			t.Errorf("normal row %s went to %q; want the primary", id, at[id])
		}
	}
}

// hookProv is a real client whose Send a test replaces.
type hookProv struct {
	*provider.Client
	send func(ctx context.Context, m provider.Message) provider.Outcome
}

func (h *hookProv) Send(ctx context.Context, m provider.Message) provider.Outcome {
	return h.send(ctx, m)
}

func (e *env) lookupClient(base string) *provider.Client {
	e.t.Helper()
	p, err := provider.New(provider.Config{BaseURL: base, APIKey: testAPIKey, Timeout: 2 * time.Second, Lookup: true})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// A Postgres failover loses the move to B after B was called: A refuses
// the first call (the request never left), the row moves to B, B takes the
// message, the promoted primary lost the move (the row names A again,
// put back during B's call) and B's answer is lost. The result write,
// fenced on the claim that survived, names B: the row is looked up there,
// never sent at A.
func TestALostMoveNeverSendsTwice(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	var mu sync.Mutex
	firstA := map[string]bool{}
	pa := e.lookupClient(e.stubURL)
	pb := e.lookupClient(secondaryURL)
	primary := &hookProv{Client: pa}
	primary.send = func(ctx context.Context, m provider.Message) provider.Outcome {
		mu.Lock()
		first := !firstA[m.Key]
		firstA[m.Key] = true
		mu.Unlock()
		if first {
			return provider.Outcome{Kind: provider.Retry, Reason: "request not sent: connect failed: connection refused"}
		}
		return pa.Send(ctx, m)
	}
	sec := &hookProv{Client: pb}
	sec.send = func(ctx context.Context, m provider.Message) provider.Outcome {
		// The failover loses the Repin: the promoted database has the row as
		// the claim left it, naming the primary.
		if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET provider = 'primary' WHERE id = $1`, m.Key); err != nil {
			t.Error(err)
		}
		_ = pb.Send(ctx, m)                                                                                                               // B takes it ...
		return provider.Outcome{Kind: provider.Ambiguous, MaybeAccepted: true, Reason: "no response after the request was sent: timeout"} // ... and the answer is lost
	}
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	big := breaker.Config{Failures: 1000}
	stop := e.startSender(senderOptions{cfg: sender.Config{LookupSettle: 200 * time.Millisecond, Routes: []sender.Route{
		{Name: "primary", Provider: primary, Breaker: breaker.New(big)},
		{Name: "secondary", Provider: sec, Breaker: breaker.New(big)}}}})
	defer stop()

	ids := e.insert(3)
	rows := e.waitTerminal(ids, 60*time.Second)
	at := e.providerOf(ids)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	for _, id := range ids {
		k := id.String()
		t.Logf("row %s: %s at %q; deliveries primary %d, secondary %d", id, rows[id].status, at[id], a[k].Deliveries, b[k].Deliveries)
		if a[k].Deliveries+b[k].Deliveries > 1 {
			t.Errorf("row %s delivered %d times across both providers ", id, a[k].Deliveries+b[k].Deliveries)
		}
	}
}

// A Postgres failover loses the claim that named B (A's circuit open, so
// B preferred): B takes the message and its answer is lost; the result
// write misses its claim. Its marks name B, and so does its attempt: the
// row is looked up at B (and at A: the redelivery may have lost anything),
// never sent at A.
func TestALostClaimNeverSendsTwice(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	pa := e.lookupClient(e.stubURL)
	pb := e.lookupClient(secondaryURL)
	sec := &hookProv{Client: pb}
	sec.send = func(ctx context.Context, m provider.Message) provider.Outcome {
		// The failover loses the claim: the promoted database has the row as
		// the relay left it.
		if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET status = 'queued', provider = NULL,
			attempt_count = attempt_count - 1, claim_id = NULL, lease_until = NULL, claim_seq = NULL, claim_delivery = NULL
			WHERE id = $1`, m.Key); err != nil {
			t.Error(err)
		}
		_ = pb.Send(ctx, m)
		return provider.Outcome{Kind: provider.Ambiguous, MaybeAccepted: true, Reason: "no response after the request was sent: timeout"}
	}
	// The primary's circuit is open at the start (and stays so): new rows
	// are named for the secondary.
	brA := breaker.New(breaker.Config{Failures: 1, OpenFor: time.Hour})
	brA.Admit()
	brA.Done(false)
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	stop := e.startSender(senderOptions{cfg: sender.Config{LookupSettle: 200 * time.Millisecond, Routes: []sender.Route{
		{Name: "primary", Provider: pa, Breaker: brA},
		{Name: "secondary", Provider: sec, Breaker: breaker.New(breaker.Config{Failures: 1000})}}}})
	defer stop()

	ids := e.insert(3)
	rows := e.waitTerminal(ids, 60*time.Second)
	at := e.providerOf(ids)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	for _, id := range ids {
		k := id.String()
		t.Logf("row %s: %s at %q; deliveries primary %d, secondary %d", id, rows[id].status, at[id], a[k].Deliveries, b[k].Deliveries)
		if a[k].Deliveries+b[k].Deliveries > 1 {
			t.Errorf("row %s delivered %d times across both providers ", id, a[k].Deliveries+b[k].Deliveries)
		}
	}
}

// A move whose second call gets a 429 keeps the attempt the first call (a
// real call at the primary, answered 503) spent: the next claim takes the
// next number, the trace shows the send, and the count matches the log.
func TestAMoveThenA429KeepsTheAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	_ = secondary
	pa := e.lookupClient(e.stubURL)
	pb := e.lookupClient(secondaryURL)
	var mu sync.Mutex
	seenA, seenB := map[string]bool{}, map[string]bool{}
	primary := &hookProv{Client: pa}
	primary.send = func(ctx context.Context, m provider.Message) provider.Outcome {
		mu.Lock()
		first := !seenA[m.Key]
		seenA[m.Key] = true
		mu.Unlock()
		if first {
			return provider.Outcome{Kind: provider.Retry, HTTPStatus: 503, Reason: "Service Unavailable"}
		}
		return pa.Send(ctx, m)
	}
	sec := &hookProv{Client: pb}
	sec.send = func(ctx context.Context, m provider.Message) provider.Outcome {
		mu.Lock()
		first := !seenB[m.Key]
		seenB[m.Key] = true
		mu.Unlock()
		if first {
			return provider.Outcome{Kind: provider.Retry, HTTPStatus: 429, Reason: "Too Many Requests"}
		}
		return pb.Send(ctx, m)
	}
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	big := breaker.Config{Failures: 1000}
	stop := e.startSender(senderOptions{cfg: sender.Config{Routes: []sender.Route{
		{Name: "primary", Provider: primary, Breaker: breaker.New(big)},
		{Name: "secondary", Provider: sec, Breaker: breaker.New(big)}}}})
	defer stop()
	ids := e.insert(3)
	e.waitTerminal(ids, 60*time.Second)
	n, err := outboxMiscounted(e, ids)
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := e.pool.Query(context.Background(), `SELECT outbox_id, attempt, outcome, coalesce(provider,''), coalesce(http_status,0) FROM sms_attempts WHERE outbox_id = ANY($1) ORDER BY id`, ids)
	for rows.Next() {
		var id uuid.UUID
		var a, hs int
		var o, p string
		_ = rows.Scan(&id, &a, &o, &p, &hs)
		t.Logf("attempt %s #%d %s at %s (%d)", id.String()[:8], a, o, p, hs)
	}
	rows.Close()
	var cnt []int
	r2, _ := e.pool.Query(context.Background(), `SELECT attempt_count FROM sms_outbox WHERE id = ANY($1)`, ids)
	for r2.Next() {
		var c int
		_ = r2.Scan(&c)
		cnt = append(cnt, c)
	}
	r2.Close()
	t.Logf("attempt counts %v", cnt)
	for _, id := range ids {
		as, err := store.Attempts(context.Background(), e.pool, id)
		if err != nil {
			t.Fatal(err)
		}
		sent := false
		for _, a := range as {
			t.Logf("trace %s: #%d %s at %q fromRow=%v", id.String()[:8], a.Number, a.Outcome, a.Provider, a.FromRow)
			sent = sent || a.Outcome == "sent"
		}
		if !sent {
			t.Errorf("row %s: trace shows no sent attempt", id)
		}
	}
	if n != 0 {
		t.Errorf("MiscountedAttempts: %d rows", n)
	}
}

func outboxMiscounted(e *env, ids []uuid.UUID) (int, error) {
	return store.MiscountedAttempts(context.Background(), e.pool, ids)
}

// lookHook is a real client whose Lookup a test replaces.
type lookHook struct {
	*provider.Client
	lookup func(ctx context.Context, q provider.LookupQuery) provider.LookupResult
}

func (h *lookHook) Lookup(ctx context.Context, q provider.LookupQuery) provider.LookupResult {
	return h.lookup(ctx, q)
}

func (e *env) traceOf(t *testing.T, ids []uuid.UUID) {
	for _, id := range ids {
		as, err := store.Attempts(context.Background(), e.pool, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			t.Logf("trace %s: #%d %s at %q: %s", id.String()[:8], a.Number, a.Outcome, a.Provider, a.Error)
		}
	}
}

// A sender died mid-call at the secondary after moving the row there, and
// a failover lost the move (the row names the primary again, sending under
// the dead sender's expired lease). The stale claim asks the secondary
// first, but only once the settle time after the lease has passed: it
// defers, and the row keeps the mark that every other provider is still
// to be asked, so the next claim asks the secondary before anything.
func TestADeferredLookupElsewhereIsNotForgotten(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	pa := e.lookupClient(e.stubURL)
	pb := e.lookupClient(secondaryURL)
	ids := e.insert(3)
	ctx := context.Background()
	for i, id := range ids {
		// The dead sender's call at the secondary: it took the message.
		if o := pb.Send(ctx, provider.Message{Key: id.String(), To: testPhone(i), Body: testBody(i)}); o.Kind != provider.Sent {
			t.Fatalf("direct send: %+v", o)
		}
		// The promoted primary: the claim survived, the move did not.
		if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sending', provider = 'primary', attempt_count = 1,
			claim_id = $2, lease_until = now() - interval '200 milliseconds' WHERE id = $1`, id, uuid.New()); err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.Publish(ctx, streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id}),
			jetstream.WithMsgID(id.String())); err != nil {
			t.Fatal(err)
		}
	}
	big := breaker.Config{Failures: 1000}
	stop := e.startSender(senderOptions{cfg: sender.Config{LookupSettle: 2 * time.Second, Routes: []sender.Route{
		{Name: "primary", Provider: pa, Breaker: breaker.New(big)},
		{Name: "secondary", Provider: pb, Breaker: breaker.New(big)}}}})
	defer stop()
	rows := e.waitTerminal(ids, 60*time.Second)
	at := e.providerOf(ids)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	e.traceOf(t, ids)
	for _, id := range ids {
		k := id.String()
		t.Logf("row %s: %s at %q; deliveries primary %d, secondary %d", id, rows[id].status, at[id], a[k].Deliveries, b[k].Deliveries)
		if a[k].Deliveries+b[k].Deliveries > 1 {
			t.Errorf("row %s delivered %d times across both providers", id, a[k].Deliveries+b[k].Deliveries)
		}
	}
}

// A failover lost the claim that named the secondary, and its sender died
// after the secondary took the message (no result write, so no mark). The
// redelivery asks the secondary, whose lookup fails once: the row keeps the
// mark, and the next claim asks the secondary again rather than only the
// primary.
func TestAFailedLookupElsewhereIsNotForgotten(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	pa := e.lookupClient(e.stubURL)
	pb := e.lookupClient(secondaryURL)
	var mu sync.Mutex
	failed := map[string]bool{}
	sec := &lookHook{Client: pb}
	sec.lookup = func(ctx context.Context, q provider.LookupQuery) provider.LookupResult {
		mu.Lock()
		first := !failed[q.Reference]
		failed[q.Reference] = true
		mu.Unlock()
		if first {
			return provider.LookupResult{Err: context.DeadlineExceeded}
		}
		return pb.Lookup(ctx, q)
	}
	ids := e.insert(3)
	ctx := context.Background()
	for i, id := range ids {
		if o := pb.Send(ctx, provider.Message{Key: id.String(), To: testPhone(i), Body: testBody(i)}); o.Kind != provider.Sent {
			t.Fatalf("direct send: %+v", o)
		}
		if _, err := e.js.Publish(ctx, streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id}),
			jetstream.WithMsgID(id.String())); err != nil {
			t.Fatal(err)
		}
	}
	// The lost claim's delivery: taken and never answered (the sender
	// died); here handed back at once.
	cons, err := e.js.Consumer(ctx, "SMS", streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < len(ids) {
		batch, err := cons.Fetch(len(ids)-got, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			_ = m.Nak()
			got++
		}
	}
	big := breaker.Config{Failures: 1000}
	stop := e.startSender(senderOptions{cfg: sender.Config{LookupSettle: 200 * time.Millisecond, Routes: []sender.Route{
		{Name: "primary", Provider: pa, Breaker: breaker.New(big)},
		{Name: "secondary", Provider: sec, Breaker: breaker.New(big)}}}})
	defer stop()
	rows := e.waitTerminal(ids, 60*time.Second)
	at := e.providerOf(ids)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	e.traceOf(t, ids)
	for _, id := range ids {
		k := id.String()
		t.Logf("row %s: %s at %q; deliveries primary %d, secondary %d", id, rows[id].status, at[id], a[k].Deliveries, b[k].Deliveries)
		if a[k].Deliveries+b[k].Deliveries > 1 {
			t.Errorf("row %s delivered %d times across both providers", id, a[k].Deliveries+b[k].Deliveries)
		}
	}
}

// Two idempotent providers without lookups (the generic API's safe
// default): a republished row (a parked retry, Gen 1) is a weak doubt, and
// a provider that cannot be asked is passed over, as one provider would
// simply send it under its key: sent, not unknown.
func TestAParkedRetryIsSentAtAnIdempotentPair(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	mk := func(base string) *provider.Client {
		p, err := provider.New(provider.Config{BaseURL: base, APIKey: testAPIKey, Timeout: 2 * time.Second, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ids := e.insert(3)
	ctx := context.Background()
	for _, id := range ids {
		// A retry parked in Postgres, republished by the reconciler.
		if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'queued', provider = 'primary', attempt_count = 2, publish_gen = 1,
			next_attempt_at = now() WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.Publish(ctx, streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id, Gen: 1}),
			jetstream.WithMsgID(id.String()+"-1")); err != nil {
			t.Fatal(err)
		}
	}
	big := breaker.Config{Failures: 1000}
	stop := e.startSender(senderOptions{cfg: sender.Config{Routes: []sender.Route{
		{Name: "primary", Provider: mk(e.stubURL), Breaker: breaker.New(big)},
		{Name: "secondary", Provider: mk(secondaryURL), Breaker: breaker.New(big)}}}})
	defer stop()
	rows := e.waitTerminal(ids, 60*time.Second)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	for _, id := range ids {
		k := id.String()
		t.Logf("row %s: %s (%s); deliveries primary %d, secondary %d", id, rows[id].status, rows[id].lastErr, a[k].Deliveries, b[k].Deliveries)
		if rows[id].status != "sent" {
			t.Errorf("row %s ended %s with no call anywhere", id, rows[id].status)
		}
	}
}

// A backlog: rows first claimed ten minutes after they were written
// (senders down). Past the duplicate window, a weak doubt: a provider that
// cannot be asked is passed over, and the rows are sent.
func TestABacklogIsSentAtAnIdempotentPair(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	mk := func(base string) *provider.Client {
		p, err := provider.New(provider.Config{BaseURL: base, APIKey: testAPIKey, Timeout: 2 * time.Second, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ids := e.insert(3)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET created_at = now() - interval '10 minutes' WHERE id = ANY($1)`, ids); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := e.js.Publish(ctx, streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id}),
			jetstream.WithMsgID(id.String())); err != nil {
			t.Fatal(err)
		}
	}
	big := breaker.Config{Failures: 1000}
	stop := e.startSender(senderOptions{cfg: sender.Config{Routes: []sender.Route{
		{Name: "primary", Provider: mk(e.stubURL), Breaker: breaker.New(big)},
		{Name: "secondary", Provider: mk(secondaryURL), Breaker: breaker.New(big)}}}})
	defer stop()
	rows := e.waitTerminal(ids, 60*time.Second)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	for _, id := range ids {
		k := id.String()
		t.Logf("row %s: %s (%s); deliveries primary %d, secondary %d", id, rows[id].status, rows[id].lastErr, a[k].Deliveries, b[k].Deliveries)
		if rows[id].status != "sent" {
			t.Errorf("row %s ended %s with no call anywhere", id, rows[id].status)
		}
	}
}

// SMS_PROVIDERS under the sender's own role (sendonce_sender): the claim
// reads the provider of a row's attempts, which migration 0019 grants.
func TestFailoverRunsAsTheSenderRole(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	_, secondaryURL := e.startStub()
	senderPool := asRole(t, e.dbURL(), "sendonce_sender")
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	senderEnv := *e
	senderEnv.pool = senderPool
	stop := senderEnv.startSender(senderOptions{cfg: sender.Config{Routes: []sender.Route{
		e.route("primary", e.stubURL, 2*time.Second), e.route("secondary", secondaryURL, 2*time.Second)}}})
	defer stop()
	ids := e.insert(5)
	rows := e.waitTerminal(ids, 60*time.Second)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			t.Errorf("row %s: %s; want sent", id, rows[id].status)
		}
	}
}

// The claim under the sender role, one provider or several, on custom and
// generic plans alike (a generic plan keeps every branch, and Postgres
// checks the permissions of all of them).
func TestClaimsRunAsTheSenderRoleOnEveryPlan(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ids := e.insert(2)
	for _, mode := range []string{"auto", "force_generic_plan"} {
		u := pgtest.AsRole(t, e.dbURL(), "sendonce_sender") + "%20-c%20plan_cache_mode%3D" + mode
		pool := newPool(t, u)
		var err error
		i := 0
		for ; i < 12 && err == nil; i++ {
			_, err = store.ClaimForSend(context.Background(), pool, ids[:1], nil, time.Minute, uuid.New())
		}
		if err != nil {
			t.Errorf("plan_cache_mode=%s, one provider: execution %d: %v", mode, i, err)
		}
		for j := 0; j < 12 && err == nil; j++ {
			_, err = store.ClaimForSendTo(context.Background(), pool, ids[1:], nil, time.Minute, uuid.New(), store.Providers{Preferred: "a", Primary: "a"})
		}
		if err != nil {
			t.Errorf("plan_cache_mode=%s, named providers: %v", mode, err)
		}
	}
}

// takeThenAnswer is a proxy in front of a provider that forwards each
// request, and answers a key's first one with status instead of the
// provider's answer, once the provider has taken it: a gateway's timeout
// or error after forwarding. The first answers wait until want keys have
// come through (or a few seconds), then open trip's circuit, as failures
// of other messages would, and are written; later requests get the
// provider's own answer.
func (e *env) takeThenAnswer(target string, want int, trip *breaker.Breaker, status func(key string) int) string {
	e.t.Helper()
	var (
		mu      sync.Mutex
		seen    = map[string]bool{}
		arrived = make(chan struct{})
		closed  bool
	)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		first := r.Method == http.MethodPost && resp.StatusCode < 300 && !seen[key]
		seen[key] = true
		if first && len(seen) >= want && !closed {
			closed = true
			close(arrived)
		}
		mu.Unlock()
		if !first {
			w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(answer)
			return
		}
		select {
		case <-arrived:
		case <-time.After(3 * time.Second):
		}
		if trip.Admit() {
			trip.Done(false)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status(key))
		_, _ = io.WriteString(w, `{"message":"the gateway gave up waiting"}`)
	}))
	e.t.Cleanup(hs.Close)
	return hs.URL
}

// A provider that honours keys, behind a gateway that answers 408 (or 425,
// or a 5xx) after forwarding the request: the provider took the message.
// The row stays with it, whatever its circuit does meanwhile: the retry
// goes to the same provider under the same key (which replays the
// stored answer), never to the next of SMS_PROVIDERS.
func TestADoubtfulAnswerKeepsTheRowWithItsProvider(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	statuses := []int{408, 425, 500, 502, 504}
	ids := e.insert(len(statuses))
	statusOf := map[string]int{}
	for i, id := range ids {
		statusOf[id.String()] = statuses[i]
	}
	brA := breaker.New(breaker.Config{Failures: 1, OpenFor: time.Hour})
	gateway := e.takeThenAnswer(e.stubURL, len(statuses), brA, func(key string) int { return statusOf[key] })
	idem := func(base string) *provider.Client {
		p, err := provider.New(provider.Config{BaseURL: base, APIKey: testAPIKey, Timeout: 5 * time.Second, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	stop := e.startSender(senderOptions{cfg: sender.Config{Routes: []sender.Route{
		{Name: "primary", Provider: idem(gateway), Breaker: brA},
		{Name: "secondary", Provider: idem(secondaryURL), Breaker: breaker.New(breaker.Config{Failures: 1000})}}}})
	defer stop()

	rows := e.waitTerminal(ids, 60*time.Second)
	at := e.providerOf(ids)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	e.traceOf(t, ids)
	for i, id := range ids {
		k := id.String()
		if a[k].Deliveries != 1 || b[k].Deliveries != 0 || rows[id].status != outbox.StatusSent || at[id] != "primary" {
			t.Errorf("row answered %d after the primary took it: %s at %q; deliveries at the primary %d, at the secondary %d; "+
				"want sent at the primary, once", statuses[i], rows[id].status, at[id], a[k].Deliveries, b[k].Deliveries)
		}
	}
}
