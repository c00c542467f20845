package e2e

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

// 1,000 rows through the real relay and two senders: every row sent, one
// delivery per key, the key is the row id, provider_ref is the stub's id.
func TestPipelineEndToEnd(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	e.startSender(senderOptions{})
	ids := e.insert(1000)
	e.waitAllSent(ids, 2*time.Minute)
	if got := len(e.stub.Deliveries()); got != len(ids) {
		t.Fatalf("provider saw %d keys, want %d", got, len(ids))
	}
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters, want 0", len(dls))
	}
	e.checkLogs(ids)
}

// The seed's chaos case: the provider accepts, the response never arrives
// (toxiproxy timeout toxic with timeout=0 on the response path), the sender
// times out and retries with the same key, and the provider replays its
// answer: one delivery, the row sent, more than one attempt.
func TestLostResponseAfterAcceptIsSentOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	proxy := e.newProxy()
	proxy.Add("lose_responses", "timeout", "downstream", map[string]any{"timeout": 0})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{baseURL: proxy.URL(), timeout: 300 * time.Millisecond})
	ids := e.insert(1)
	e.setBudget(ids, 100)
	key := ids[0].String()

	testkit.WaitFor(t, 30*time.Second, "the provider to accept the message", func() bool {
		return e.stub.Deliveries()[key].Deliveries == 1
	})
	testkit.WaitFor(t, 30*time.Second, "the sender to retry after the lost response", func() bool {
		return e.row(ids[0]).attempts >= 2
	})
	proxy.Remove("lose_responses")
	rows := e.waitTerminal(ids, 30*time.Second)
	r := rows[ids[0]]
	if r.status != outbox.StatusSent || r.attempts < 2 {
		t.Fatalf("row = %+v, want sent after more than one attempt", r)
	}
	d := e.stub.Deliveries()[key]
	if d.Deliveries != 1 || d.Requests < 2 {
		t.Fatalf("provider: %+v, want 1 delivery from at least 2 requests", d)
	}
	e.checkOnce(ids, rows)
}

// A relay that crashes between its PubAcks and its queued write, while the
// senders already consume what it published: after a restart no row is lost
// and none is delivered twice.
func TestRelayCrashMidBatchLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.startSender(senderOptions{})
	ids := e.insert(600)

	// A relay driven by hand crashes three times, then a healthy one runs.
	_, js := e.nats.Connect(t)
	r, err := relay.New(relay.Config{Pool: e.pool, JetStream: js, BatchSize: 200, Logger: e.logger()})
	if err != nil {
		t.Fatal(err)
	}
	var crashes atomic.Int32
	relay.SetAfterAcksForTest(r, func() error {
		crashes.Add(1)
		return errors.New("simulated crash between PubAck and queued write")
	})
	for range 3 {
		if _, err := r.RelayBatch(context.Background()); err == nil {
			t.Fatal("a batch passed the crash hook")
		}
	}
	e.startRelay(relay.Config{BatchSize: 200})
	rows := e.waitTerminal(ids, 2*time.Minute)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			t.Fatalf("row %s ended %s, want sent", id, rows[id].status)
		}
	}
	e.checkOnce(ids, rows)
}

// A publication that arrives after its row is finished (a republish after
// the Duplicates window, or a redelivery) is acked without a provider call.
func TestLateRepublishIsSkipped(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	ids := e.insert(5)
	e.waitTerminal(ids, time.Minute)
	before := e.stub.Stats()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range ids {
		// A new Nats-Msg-Id, as a republish after the dedup window would have.
		data := wire.AppendEncode(nil, wire.Send{ID: id})
		if _, err := e.js.Publish(ctx, streams.SubjectSend, data, jetstream.WithMsgID(id.String()+":late")); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, 30*time.Second, "the late copies to be acked", func() bool {
		c, err := e.js.Consumer(ctx, streams.Stream, streams.Consumer)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	after := e.stub.Stats()
	if after.Requests != before.Requests {
		t.Fatalf("provider got %d more requests for finished rows, want 0", after.Requests-before.Requests)
	}
	e.checkOnce(ids, e.rows())
}

// A message on sms.send that did not come from the relay is dead-lettered
// with reason invalid; it neither crashes a sender nor loops, and real work
// goes on.
func TestForeignMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bad := [][]byte{
		[]byte("not json"),
		[]byte(`{"id":"00000000-0000-0000-0000-000000000000"}`),
		[]byte(`{"id":"7b1e9c1e-8f0a-4d5e-9b4c-2a6f7e8d9c0b","gen":0}`), // no such row
		{},
	}
	for i, data := range bad {
		msg := &nats.Msg{Subject: streams.SubjectSend, Data: data}
		if _, err := e.js.PublishMsg(ctx, msg, jetstream.WithMsgID("foreign-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	ids := e.insert(10)
	rows := e.waitTerminal(ids, time.Minute)
	e.checkOnce(ids, rows)
	testkit.WaitFor(t, 30*time.Second, "4 dead letters", func() bool { return len(e.deadLetters()) == len(bad) })
	for _, dl := range e.deadLetters() {
		if dl.Header.Get(wire.HeaderReason) != wire.ReasonInvalid {
			t.Errorf("dead letter reason %q, want invalid", dl.Header.Get(wire.HeaderReason))
		}
	}
	if got := e.stub.Stats().Requests; got != int64(len(ids)) {
		t.Fatalf("provider got %d requests, want %d (none for foreign messages)", got, len(ids))
	}
}

// A permanent rejection: dead after exactly one call, with one dead letter
// carrying the original payload and the Sendonce-* headers.
func TestPermanentFailureIsDeadLetteredAfterOneCall(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{FailRate: 1, FailStatus: 400, FailCode: 21211}}})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	ids := e.insert(3)
	rows := e.waitTerminal(ids, time.Minute)
	dls := e.lettersOf(ids, 30*time.Second)
	for _, id := range ids {
		r := rows[id]
		if r.status != outbox.StatusDead || r.attempts != 1 || r.lastErr == "" {
			t.Errorf("row = %+v, want dead after 1 attempt with its reason", r)
		}
		d := e.stub.Deliveries()[id.String()]
		if d.Requests != 1 || d.Deliveries != 0 {
			t.Errorf("provider: %+v, want exactly 1 request and no delivery", d)
		}
		mine := deadLetterFor(dls, id)
		if len(mine) != 1 {
			t.Fatalf("%d dead letters for %s, want 1", len(mine), id)
		}
		h := mine[0].Header
		if h.Get(wire.HeaderReason) != wire.ReasonPermanent || h.Get(wire.HeaderProviderCode) != "21211" || h.Get(wire.HeaderAttempts) != "1" || h.Get(wire.HeaderError) == "" {
			t.Errorf("dead letter headers = %v", h)
		}
		if p, err := wire.Decode(mine[0].Data); err != nil || p.ID != id {
			t.Errorf("dead letter payload = %q, %v", mine[0].Data, err)
		}
	}
}

// Retryable failures are retried with the same key until the provider
// recovers; attempts are counted in the row.
func TestRetryableFailuresRecover(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{FailRate: 1, FailStatus: 503}}})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	ids := e.insert(20)
	e.setBudget(ids, 100)
	// Count at the stub, which draws its fault under the same lock that
	// counts the request: a row's attempt_count rises when a sender claims
	// it, before the call, so "attempts >= 2" can still have its second
	// call ahead of it and land after the faults are cleared.
	testkit.WaitFor(t, 30*time.Second, "every row to fail at least twice", func() bool {
		got := e.stub.Deliveries()
		for _, id := range ids {
			if got[id.String()].Requests < 2 {
				return false
			}
		}
		return true
	})
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	rows := e.waitTerminal(ids, time.Minute)
	for _, id := range ids {
		if r := rows[id]; r.status != outbox.StatusSent || r.attempts < 3 {
			t.Errorf("row = %+v, want sent after at least 3 attempts", r)
		}
	}
	e.checkOnce(ids, rows)
}

// Attempts are bounded by max_attempts, and how a row ends depends on what
// its attempts may have done: dead (reason max_attempts) only when every
// answer said the message was not taken; unknown (reason ambiguous) when an
// attempt may have reached the provider, because "dead" tells the
// application the user got nothing. One dead letter either way, and never
// retried forever.
func TestAttemptsAreBounded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		faults     smsstub.Faults
		toxic      string // a toxiproxy toxic on the response path, after the stub answered
		wantStatus outbox.State
		wantReason string
		delivered  int
	}{
		{name: "503s", faults: smsstub.Faults{FailRate: 1, FailStatus: 503}, wantStatus: outbox.StatusDead, wantReason: wire.ReasonMaxAttempts},
		{name: "500s", faults: smsstub.Faults{FailRate: 1, FailStatus: 500}, wantStatus: outbox.StatusUnknown, wantReason: wire.ReasonAmbiguous},
		// The soak's case: the provider accepted, every answer was lost.
		{name: "responses reset after accepting", toxic: "reset_peer", wantStatus: outbox.StatusUnknown, wantReason: wire.ReasonAmbiguous, delivered: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, envOptions{stub: smsstub.Config{Faults: tt.faults}})
			base := ""
			if tt.toxic != "" {
				proxy := e.newProxy()
				proxy.Add("lose", tt.toxic, "downstream", map[string]any{"timeout": 0})
				base = proxy.URL()
			}
			e.startRelay(relay.Config{})
			// Insert before the sender starts, so the budget is lowered first.
			ids := e.insert(1)
			if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET max_attempts = 3 WHERE id = $1`, ids[0]); err != nil {
				t.Fatal(err)
			}
			e.startSender(senderOptions{baseURL: base, timeout: 2 * time.Second})
			rows := e.waitTerminal(ids, time.Minute)
			if r := rows[ids[0]]; r.status != tt.wantStatus || r.attempts != 3 {
				t.Fatalf("row = %+v, want %s after 3 attempts", r, tt.wantStatus)
			}
			dl := deadLetterFor(e.lettersOf(ids[:1], 30*time.Second), ids[0])
			if len(dl) != 1 || dl[0].Header.Get(wire.HeaderReason) != tt.wantReason {
				t.Fatalf("dead letters = %v, want one with reason %s", dl, tt.wantReason)
			}
			d := e.stub.Deliveries()[ids[0].String()]
			if d.Requests != 3 || d.Deliveries != tt.delivered {
				t.Fatalf("provider got %d requests and delivered %d times, want 3 and %d", d.Requests, d.Deliveries, tt.delivered)
			}
			e.checkOnce(ids, rows)
		})
	}
}

// A claim waits for busy slots only while attempts already running hold
// them: a sender whose every slot is in its own batch claims at once, even
// with a linger of an hour and messages waiting behind it.
func TestClaimLingerNeverWaitsOnItsOwnBatch(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.startRelay(relay.Config{})
	reg := prometheus.NewRegistry()
	e.startSender(senderOptions{cfg: sender.Config{Concurrency: 1, ClaimBatch: 4, ClaimLinger: time.Hour, Registerer: reg}})
	ids := e.insert(20)
	e.waitAllSent(ids, time.Minute)
	// One slot: every claim held one row, and each row was claimed once.
	count, sum := batchRows(t, reg, "claim")
	if count != 20 || sum != 20 {
		t.Fatalf("claims: %d holding %v rows, want 20 holding 20", count, sum)
	}
}

// batchRows returns how many batches sendonce_sender_batch_rows counted for
// op, and their rows.
func batchRows(t *testing.T, reg *prometheus.Registry, op string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sendonce_sender_batch_rows" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	t.Fatalf("no sendonce_sender_batch_rows{op=%q}", op)
	return 0, 0
}

// A status write waits for outcomes only while attempts are running: the
// last outcome of a burst is written at once, even with a linger of an hour.
func TestWriteLingerNeverWaitsWithNoAttemptRunning(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.startRelay(relay.Config{})
	reg := prometheus.NewRegistry()
	e.startSender(senderOptions{cfg: sender.Config{Concurrency: 4, WriteLinger: time.Hour, Registerer: reg}})
	ids := e.insert(20)
	e.waitAllSent(ids, time.Minute)
	// Each row's outcome was written once, in however many writes.
	if count, sum := batchRows(t, reg, "status_write"); count < 1 || count > 20 || sum != 20 {
		t.Fatalf("status writes: %d holding %v rows, want 1 to 20 holding 20", count, sum)
	}
}
