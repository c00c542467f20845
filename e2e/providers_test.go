package e2e

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/breaker"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
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
