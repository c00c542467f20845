package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
)

// Faults that compose: each test here puts the row in the state a Postgres
// failover leaves it in (the promoted standby never received the claim, or
// the relay's mark, of an attempt the provider took) while the provider
// misbehaves, and holds the promise at a provider without idempotency: the
// phone buzzes once.

// rewind puts a row back as a standby that missed its latest writes holds
// it: status st, no claim, no attempt made, no mark.
func (e *env) rewind(id uuid.UUID, st outbox.State) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox
		SET status = $2, claim_id = NULL, lease_until = NULL, attempt_count = 0, maybe_accepted = false,
		    lookup_pending = false, next_attempt_at = now(), claim_seq = NULL, claim_delivery = NULL
		WHERE id = $1`, id, string(st)); err != nil {
		e.t.Fatal(err)
	}
}

// A failover during a lost answer: the provider took the message and holds
// its answer; meanwhile the primary dies before the claim replicated, and
// the promoted database has the row queued, with no trace of the attempt.
// The attempt's write misses its claim. The message's redelivery must not
// call again: with lookups the provider is asked and the row is sent, with
// none it ends unknown. Either way, one delivery.
func TestFailoverDuringALostAnswer(t *testing.T) {
	t.Parallel()
	for _, lookup := range []bool{true, false} {
		name := "without lookups"
		if lookup {
			name = "with lookups"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true,
				Faults: smsstub.Faults{WithholdRate: 1, WithholdMode: smsstub.WithholdHang}}})
			e.startRelay(relay.Config{})
			no := false
			e.startSender(senderOptions{idempotent: &no, lookup: lookup, timeout: 2 * time.Second,
				cfg: sender.Config{LookupSettle: time.Second}})
			ids := e.insert(1)
			id := ids[0]
			testkit.WaitFor(t, 30*time.Second, "the provider took the message", func() bool {
				return e.stub.Deliveries()[id.String()].Deliveries == 1
			})
			// The failover, while the call waits for its answer.
			e.rewind(id, outbox.StatusQueued)
			if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
				t.Fatal(err)
			}
			rows := e.waitTerminal(ids, 2*time.Minute)
			if r := rows[id]; lookup && !accepted(r.status) || !lookup && r.status != outbox.StatusUnknown {
				t.Errorf("row = %+v, want settled by the lookup (with lookups) or unknown (without)", r)
			}
			if d := e.stub.Deliveries()[id.String()]; d.Deliveries != 1 {
				t.Fatalf("%d deliveries, want 1: the redelivery called again", d.Deliveries)
			}
		})
	}
}

// A rewound database: the provider has the message, but the promoted
// standby (or a point-in-time restore) has the row back before its attempt,
// with nothing marked, and only a later publication brings it back: a
// republication (generation 1, by the reconciler or an operator), or one of
// generation 0 under its first Nats-Msg-Id that the stream no longer
// remembers (the row is older than the duplicate window, or than the
// stream itself after a store loss), claimed from pending as a first
// attempt. At a provider without idempotency the sender asks before that
// call: sent once, never twice.
func TestRewoundRowIsLookedUpFirst(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, rewind string }{
		{"republished", `UPDATE sms_outbox SET publish_gen = 1 WHERE id = $1`},
		{"older than the duplicate window", `UPDATE sms_outbox SET created_at = now() - interval '1 hour' WHERE id = $1`},
		{"older than the stream", `UPDATE sms_outbox SET created_at = now() - interval '30 seconds' WHERE id = $1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
			ids := e.insert(1)
			id := ids[0]
			e.postDirect(id, 0)
			if _, err := e.pool.Exec(context.Background(), tc.rewind, id); err != nil {
				t.Fatal(err)
			}
			no := false
			e.startRelay(relay.Config{})
			e.startSender(senderOptions{idempotent: &no, lookup: true})
			rows := e.waitTerminal(ids, time.Minute)
			if r := rows[id]; !accepted(r.status) || r.attempts != 0 {
				t.Fatalf("row %+v, want settled by a lookup without an attempt", r)
			}
			if d := e.stub.Deliveries()[id.String()]; d.Deliveries != 1 {
				t.Fatalf("%d deliveries, want the one from before the rewind", d.Deliveries)
			}
		})
	}
}

// A stale claim is looked up no sooner than the settle time after the lease
// it took over ran out: the dead attempt's request may have been made just
// before, and the provider may not show it yet.
func TestStaleClaimWaitsTheSettleTime(t *testing.T) {
	t.Parallel()
	const settle = 3 * time.Second
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
	ids := e.insert(1)
	id := ids[0]
	// A sender died mid-call: the row is sending under a lease that ran
	// out a moment ago.
	var leaseEnd time.Time
	if err := e.pool.QueryRow(context.Background(), `UPDATE sms_outbox
		SET status = 'sending', attempt_count = 1, claim_id = $2, lease_until = now() - interval '200 milliseconds'
		WHERE id = $1 RETURNING lease_until`, id, uuid.New()).Scan(&leaseEnd); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(context.Background(), streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id}),
		jetstream.WithMsgID(id.String())); err != nil {
		t.Fatal(err)
	}
	no := false
	e.startSender(senderOptions{idempotent: &no, lookup: true, cfg: sender.Config{LookupSettle: settle}})
	rows := e.waitTerminal(ids, time.Minute)
	if r := rows[id]; r.status != outbox.StatusSent {
		t.Fatalf("row %+v, want sent (the lookup found nothing, then one call)", r)
	}
	// When the lookup began (the attempts log's record of it), not when
	// its answer was recorded.
	var lookedUp time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT min(started_at) FROM sms_attempts WHERE outbox_id = $1 AND outcome = 'lookup'`,
		id).Scan(&lookedUp); err != nil {
		t.Fatal(err)
	}
	if early := leaseEnd.Add(settle).Sub(lookedUp); early > 0 {
		t.Fatalf("the provider was asked %s before the settle time after the lease ran out", early)
	}
	if d := e.stub.Deliveries()[id.String()]; d.Deliveries != 1 {
		t.Fatalf("%d deliveries, want 1", d.Deliveries)
	}
}

// postDirect sends row id's message to the stub as a sender of generation
// gen did before a rewind lost every trace of it.
func (e *env) postDirect(id uuid.UUID, i int) {
	e.t.Helper()
	body, _ := json.Marshal(map[string]string{"to": testPhone(i), "body": testBody(i), "reference": id.String()})
	req, _ := http.NewRequest(http.MethodPost, e.stubURL+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	req.Header.Set("Idempotency-Key", id.String())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		e.t.Fatalf("direct send: http %d", resp.StatusCode)
	}
}

// A claim that answered late (here it waited for a lock another
// transaction held on the row) leaves too little of its lease for the
// provider call: the call is not made, since it could outlive the lease and
// overlap the next claim's; the row is claimed again, and sent once.
func TestNoCallOutlivesItsLease(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
	ids := e.insert(1)
	id := ids[0]
	ctx := context.Background()
	if _, err := e.js.Publish(ctx, streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id}),
		jetstream.WithMsgID(id.String())); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // released below
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sms_outbox WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	var holder int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	no := false
	e.startSender(senderOptions{idempotent: &no, timeout: time.Second,
		cfg: sender.Config{Lease: 2500 * time.Millisecond, Registerer: reg}})
	// The claim waits for the lock: hold it past the lease less a call.
	testkit.WaitFor(t, 30*time.Second, "the sender's claim waiting for the row", func() bool {
		var n int
		// Blocked by this transaction, whatever its statement's text (the
		// activity view keeps only its first kilobyte).
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, holder).Scan(&n)
		return n > 0
	})
	time.Sleep(2 * time.Second) // the time the claim is held up: what this test is about
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	rows := e.waitTerminal(ids, time.Minute)
	if r := rows[id]; r.status != outbox.StatusSent || r.attempts != 1 {
		t.Fatalf("row %+v, want sent on its one attempt (the claim without time gave its attempt back)", r)
	}
	if n := counterValue(t, reg, "sendonce_sender_held_back_total"); n < 1 {
		t.Fatalf("%v claims held back, want the one that answered too late for the call", n)
	}
	if d := e.stub.Deliveries()[id.String()]; d.Requests != 1 {
		t.Fatalf("%d requests, want 1", d.Requests)
	}
}

// A Twilio lookup finds messages by number and text. Two rows carry the
// same text to the same number: the first attempt of one was lost before
// Twilio took it, the other's was taken and its answer lost. Both lookups
// find the one message; nothing says whose it is, so neither row may be
// settled by it (the first would end sent, and its text never go out):
// both end unknown, for a person, and nothing is sent again.
func TestTwilioLookupCannotTellTwinsApart(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true, Twilio: testTwilio,
		Faults: smsstub.Faults{DropRate: 1}}})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{twilio: true, lookup: true,
		cfg: sender.Config{LookupSettle: 200 * time.Millisecond, LookupBudget: 2}})
	ctx := context.Background()
	const to, text = "+15557654321", "Your table is ready."
	insert := func() uuid.UUID {
		t.Helper()
		id := uuid.New()
		if _, err := e.pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, $3)`, id, to, text); err != nil {
			t.Fatal(err)
		}
		return id
	}
	lost := insert()
	testkit.WaitFor(t, 30*time.Second, "the first row's request lost on its way", func() bool {
		return e.stub.Stats().Dropped >= 1
	})
	if err := e.stub.SetFaults(smsstub.Faults{WithholdRate: 1, WithholdMode: smsstub.WithholdClose}); err != nil {
		t.Fatal(err)
	}
	taken := insert()
	testkit.WaitFor(t, 30*time.Second, "the second row's message taken", func() bool { return e.stub.Stats().Deliveries >= 1 })
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	rows := e.waitTerminal([]uuid.UUID{lost, taken}, time.Minute)
	for id, r := range rows {
		if id != lost && id != taken {
			continue
		}
		if r.status != outbox.StatusUnknown {
			t.Errorf("row %s is %s, want unknown: the message found may be either row's", id, r.status)
		}
	}
	if n := e.stub.Stats().Deliveries; n != 1 {
		t.Fatalf("%d messages sent, want the one taken before", n)
	}
}

// A failover loses the claim of a call still in flight, and the promoted
// database shows the row queued and long untouched: stuck, by its looks.
// The reconciler must not republish it while the message is still held
// (its consumer's ack floor is behind it): a second sender would ask the
// provider before the first call's request shows, find nothing, and send
// again. The holder's answer settles the row; one delivery.
func TestReconcilerLeavesAHeldMessageAlone(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true, Faults: smsstub.Faults{Latency: 3 * time.Second}}})
	ids := e.insert(1)
	id := ids[0]
	ctx := context.Background()
	e.startRelay(relay.Config{})
	no := false
	e.startSender(senderOptions{idempotent: &no, lookup: true, timeout: 6 * time.Second,
		cfg: sender.Config{LookupSettle: time.Second}})
	testkit.WaitFor(t, 30*time.Second, "the call in flight", func() bool {
		var st string
		_ = e.pool.QueryRow(ctx, `SELECT status FROM sms_outbox WHERE id = $1`, id).Scan(&st)
		return st == "sending"
	})
	// What the promoted standby holds: queued, long ago, the claim lost.
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'queued', claim_id = NULL, lease_until = NULL, attempt_count = 0,
		claim_seq = NULL, claim_delivery = NULL, updated_at = now() - interval '1 hour', next_attempt_at = now() - interval '1 hour'
		WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.newReconciler(time.Second).Pass(ctx); err != nil {
		t.Fatal(err)
	}
	var gen int
	if err := e.pool.QueryRow(ctx, `SELECT publish_gen FROM sms_outbox WHERE id = $1`, id).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	if gen != 0 {
		t.Fatalf("the reconciler republished a row whose message a sender still holds (generation %d)", gen)
	}
	rows := e.waitTerminal(ids, time.Minute)
	if r := rows[id]; !accepted(r.status) {
		t.Fatalf("row %+v, want settled by the holder's answer", r)
	}
	if d := e.stub.Deliveries()[id.String()]; d.Deliveries != 1 {
		t.Fatalf("%d deliveries, want 1", d.Deliveries)
	}
}

// A provider that refuses every connection (nothing is ever sent), at a
// provider without idempotency that can be looked up: each retry's
// redelivery finds the previous delivery's claim and its outcome in the
// row, so no lookup comes before it (one would fail as well, and a failed
// lookup gives its attempt back: the row would never spend its budget and
// end unknown instead of dead). The row ends dead, its attempts spent.
func TestRetriesOfANeverReachedProviderAreNotLookedUp(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ids := e.insert(1)
	id := ids[0]
	e.setBudget(ids, 3)
	e.startRelay(relay.Config{})
	no := false
	e.startSender(senderOptions{idempotent: &no, lookup: true, timeout: time.Second, baseURL: "http://127.0.0.1:1",
		cfg: sender.Config{LookupSettle: 200 * time.Millisecond, LookupBudget: 3}})
	rows := e.waitTerminal(ids, time.Minute)
	if r := rows[id]; r.status != outbox.StatusDead || r.attempts != 3 {
		t.Fatalf("row %+v, want dead after its 3 attempts", r)
	}
	if ev := e.evidenceCounts(); len(ev) != 0 {
		t.Fatalf("lookups made before retries that followed refused connections: %v", ev)
	}
}
