package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
)

// evidenceStub is a provider without idempotency that sends signed
// receipts: messages to numbers ending in 3 end undelivered. A receipt
// comes 50-850 ms after acceptance: some before the sender's lookup (200 ms
// after a lost answer), some after.
func evidenceStub(f smsstub.Faults) smsstub.Config {
	return smsstub.Config{IgnoreKeys: true, Faults: f, Receipts: smsstub.Receipts{
		Secret: testReceiptSecret, Delay: 50 * time.Millisecond, Jitter: 800 * time.Millisecond,
		DuplicateRate: 0.3, ReorderRate: 0.3, UndeliveredSuffixes: []string{"3"},
	}}
}

// waitSettled waits until every row in ids is delivered or undelivered.
func (e *env) waitSettled(ids []uuid.UUID, d time.Duration) map[uuid.UUID]row {
	e.t.Helper()
	var rows map[uuid.UUID]row
	testkit.WaitFor(e.t, d, "every row delivered or undelivered", func() bool {
		rows = e.rows()
		for _, id := range ids {
			if s := rows[id].status; s != outbox.StatusDelivered && s != outbox.StatusUndelivered {
				return false
			}
		}
		return true
	})
	return rows
}

// evidenceCounts counts the rows' evidence by kind and result.
func (e *env) evidenceCounts() map[string]int {
	e.t.Helper()
	rs, _ := e.pool.Query(context.Background(), `SELECT kind || ':' || result, count(*) FROM sms_evidence GROUP BY 1`)
	out := map[string]int{}
	var k string
	var n int
	if _, err := pgx.ForEachRow(rs, []any{&k, &n}, func() error { out[k] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// The promise at a provider without idempotency: answers lost after the
// provider took the message, requests lost before it did, 503s, and
// numbers that cannot be reached. Every row ends delivered or undelivered,
// as the provider decided, none unknown, each sent exactly once; receipts
// come twice, out of order, and before the sender's own write.
func TestNonIdempotentProviderSettledByEvidence(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: evidenceStub(smsstub.Faults{
		WithholdRate: 0.15, WithholdMode: smsstub.WithholdClose, DropRate: 0.1, FailRate: 0.1, FailStatus: 503,
	})})
	rcv := e.startReceiver()
	no := false
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{idempotent: &no, lookup: true, receipts: rcv,
		cfg: sender.Config{LookupSettle: 200 * time.Millisecond}})
	e.background("reconciler", e.newReconciler(time.Minute).Run)
	ids := e.insert(300)
	e.setBudget(ids, 30)
	rows := e.waitSettled(ids, 3*time.Minute)
	deliveries := e.stub.Deliveries()
	undelivered := 0
	for i, id := range ids {
		want := outbox.StatusDelivered
		if strings.HasSuffix(testPhone(i), "3") {
			want = outbox.StatusUndelivered
			undelivered++
		}
		if rows[id].status != want {
			t.Errorf("row %d is %s, want %s as the provider decided", i, rows[id].status, want)
		}
		if d := deliveries[id.String()]; d.Deliveries != 1 {
			t.Errorf("row %d: %d deliveries, want 1", i, d.Deliveries)
		}
	}
	e.checkOnce(ids, rows)
	e.checkLogs(ids)
	st := e.stub.Stats()
	ev := e.evidenceCounts()
	t.Logf("stub: %d requests, %d withheld, %d dropped, %d failed, %d lookups, %d receipts; evidence %v; %d undelivered",
		st.Requests, st.Withheld, st.Dropped, st.Failures, st.Lookups, st.ReceiptsSent, ev, undelivered)
	if st.Withheld == 0 || st.Dropped == 0 || ev["lookup:found"] == 0 || ev["lookup:none"] == 0 {
		t.Fatalf("the faults did not bite (withheld %d, dropped %d, lookups %v): the test proves nothing", st.Withheld, st.Dropped, ev)
	}
}

// A receipt that arrives before the sender's sent write (the provider's
// answer is held up on the way back): the row is delivered, and the late
// sent write changes nothing.
func TestReceiptBeforeTheSentWrite(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Receipts: smsstub.Receipts{Secret: testReceiptSecret, Delay: time.Millisecond}}})
	rcv := e.startReceiver()
	proxy := e.newProxy()
	proxy.Add("slow_answer", "latency", "downstream", map[string]any{"latency": 1500})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{baseURL: proxy.URL(), receipts: rcv, timeout: 10 * time.Second})
	ids := e.insert(3)
	rows := e.waitSettled(ids, time.Minute)
	// The sender's answer arrives 1.5 s after the receipt: wait for its
	// write (a sender acks a message only once its write committed), then
	// check it moved nothing.
	testkit.WaitFor(t, 30*time.Second, "the sender's writes (its acks)", func() bool {
		c, err := e.js.Consumer(context.Background(), streams.Stream, streams.Consumer)
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= uint64(len(ids))
	})
	after := e.rows()
	for _, id := range ids {
		if rows[id].status != outbox.StatusDelivered || after[id].status != outbox.StatusDelivered {
			t.Errorf("row %s: %s, then %s after the sender's write; want delivered throughout", id, rows[id].status, after[id].status)
		}
	}
	e.checkOnce(ids, after)
}

// An unknown row (its answer lost at a provider without idempotency, no
// lookups) is settled by the receipt that follows.
func TestReceiptSettlesUnknown(t *testing.T) {
	t.Parallel()
	// The receipt comes a second after the answer was lost: the row is
	// unknown by then.
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true,
		Faults:   smsstub.Faults{WithholdRate: 1, WithholdMode: smsstub.WithholdClose},
		Receipts: smsstub.Receipts{Secret: testReceiptSecret, Delay: time.Second}}})
	rcv := e.startReceiver()
	no := false
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{idempotent: &no, receipts: rcv})
	ids := e.insert(1)
	if r := e.waitTerminal(ids, time.Minute)[ids[0]]; r.status != outbox.StatusUnknown {
		t.Fatalf("row %+v before the receipt, want unknown", r)
	}
	rows := e.waitSettled(ids, time.Minute)
	ev, err := outbox.EvidenceOf(context.Background(), e.pool, ids[0])
	if err != nil || len(ev) == 0 || ev[0].Kind != "receipt" {
		t.Fatalf("evidence = %+v, %v", ev, err)
	}
	var attempts []string
	rs, _ := e.pool.Query(context.Background(), `SELECT outcome FROM sms_attempts WHERE outbox_id = $1 ORDER BY id`, ids[0])
	attempts, err = pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil || len(attempts) != 1 || attempts[0] != "ambiguous" {
		t.Fatalf("attempts = %v, %v; want the one ambiguous attempt", attempts, err)
	}
	if rows[ids[0]].status != outbox.StatusDelivered || e.stub.Deliveries()[ids[0].String()].Deliveries != 1 {
		t.Fatalf("row %+v, want delivered once", rows[ids[0]])
	}
}

// A lookup that fails is asked again later, without spending attempts, and
// settles the row once it answers.
func TestLookupFailsThenSucceeds(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true, Faults: smsstub.Faults{
		WithholdRate: 1, WithholdMode: smsstub.WithholdClose, LookupFailRate: 1,
	}}})
	no := false
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{idempotent: &no, lookup: true,
		cfg: sender.Config{LookupSettle: 100 * time.Millisecond, LookupBudget: 1000}})
	e.background("reconciler", e.newReconciler(time.Minute).Run)
	ids := e.insert(1)
	var lookups int
	testkit.WaitFor(t, time.Minute, "three failed lookups", func() bool {
		_ = e.pool.QueryRow(context.Background(), `SELECT lookups FROM sms_outbox WHERE id = $1`, ids[0]).Scan(&lookups)
		return lookups >= 3
	})
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	rows := e.waitTerminal(ids, time.Minute)
	r := rows[ids[0]]
	if !accepted(r.status) || r.attempts != 1 || e.stub.Deliveries()[ids[0].String()].Deliveries != 1 {
		t.Fatalf("row %+v (deliveries %d), want settled by the lookup after its one attempt", r, e.stub.Deliveries()[ids[0].String()].Deliveries)
	}
	ev, err := outbox.EvidenceOf(context.Background(), e.pool, ids[0])
	if err != nil || len(ev) < 4 || ev[0].Result != "failed" || ev[len(ev)-1].Result != "found" || ev[len(ev)-1].ProviderRef != r.ref {
		t.Fatalf("evidence = %+v, %v; want failed lookups, then found", ev, err)
	}
}

// A lookup that finds the message twice (it was already sent more than
// once): unknown, for a person; nothing more is sent.
func TestLookupFindsTwoMessages(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
	ids := e.insert(1)
	id := ids[0]
	// Two earlier sends of the row reached the provider, and the last
	// attempt's answer was lost.
	for range 2 {
		body, _ := json.Marshal(map[string]string{"to": testPhone(0), "body": testBody(0), "reference": id.String()})
		req, _ := http.NewRequest(http.MethodPost, e.stubURL+"/v1/messages", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+testAPIKey)
		req.Header.Set("Idempotency-Key", id.String())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET lookup_pending = true, maybe_accepted = true, attempt_count = 2 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	no := false
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{idempotent: &no, lookup: true})
	rows := e.waitTerminal(ids, time.Minute)
	if r := rows[id]; r.status != outbox.StatusUnknown || r.attempts != 2 {
		t.Fatalf("row %+v, want unknown with its 2 attempts", r)
	}
	if d := e.stub.Deliveries()[id.String()]; d.Deliveries != 2 {
		t.Fatalf("%d deliveries, want the 2 earlier ones only", d.Deliveries)
	}
	dl := deadLetterFor(e.lettersOf(ids, 30*time.Second), id)
	if len(dl) != 1 || dl[0].Header.Get(wire.HeaderReason) != wire.ReasonAmbiguous || !strings.Contains(dl[0].Header.Get(wire.HeaderError), "2 messages") {
		t.Fatalf("dead letters = %v", dl)
	}
}
