package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/breaker"
	"github.com/sendonce/sendonce/internal/deadletter"
	store "github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

// A rolling restart under SMS_PROVIDERS without lookups: a sender held to
// 2 requests a second is stopped gracefully while it holds most of the
// backlog fetched and unclaimed. It hands those messages back; their next
// delivery, at the sender that replaces it, is not a lost attempt: every
// row is sent, once, at one provider, and none ends unknown without a call.
func TestARollingRestartLeavesNothingUnknown(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	routes := func() []sender.Route {
		return []sender.Route{e.route("primary", e.stubURL, 2*time.Second), e.route("secondary", secondaryURL, 2*time.Second)}
	}
	slow := 2.0
	stop := e.startSender(senderOptions{flow: &slow, cfg: sender.Config{Routes: routes()}})
	ids := e.insert(30)
	// Wait until the sender holds messages it has not claimed, then stop it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		open, attempted := e.progress(ids)
		if attempted >= 3 && open >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slow sender never held a backlog: %d open, %d attempted", open, attempted)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	open, _ := e.progress(ids)
	t.Logf("stopped the first sender with %d of %d rows open", open, len(ids))

	// Its replacement, after a rolling restart.
	stop = e.startSender(senderOptions{cfg: sender.Config{Routes: routes()}})
	defer stop()
	rows := e.waitTerminal(ids, 60*time.Second)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	for _, id := range ids {
		k := id.String()
		n := a[k].Deliveries + b[k].Deliveries
		if rows[id].status != outbox.StatusSent || n != 1 {
			t.Errorf("row %s: %s (%s), deliveries primary %d, secondary %d; want sent once",
				id, rows[id].status, rows[id].lastErr, a[k].Deliveries, b[k].Deliveries)
		}
	}
}

// progress counts the rows of ids not yet finished, and those attempted.
func (e *env) progress(ids []uuid.UUID) (open, attempted int) {
	e.t.Helper()
	var o, a int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status NOT IN ('sent', 'delivered', 'undelivered', 'dead', 'unknown')),
		count(*) FILTER (WHERE attempt_count > 0) FROM sms_outbox WHERE id = ANY($1)`, ids).Scan(&o, &a); err != nil {
		e.t.Fatal(err)
	}
	return o, a
}

// A row made unknown because another provider of the list may hold its
// message (a claim a failover lost, a provider that cannot be asked) is
// refused by a replay unless forced, though its own provider honours keys:
// a replay would call its own provider while the other has the message.
func TestAReplayNeverSendsWhatAnotherProviderMayHave(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	ctx := context.Background()
	mk := func(base string) *provider.Client {
		p, err := provider.New(provider.Config{BaseURL: base, APIKey: testAPIKey, Timeout: 2 * time.Second, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	pa, pb := mk(e.stubURL), mk(secondaryURL)
	id := e.insert(1)[0]
	// The secondary took the message under a move a Postgres failover
	// lost, with the claim that made it: the promoted database shows the
	// row as an earlier claim at the primary left it.
	if o := pb.Send(ctx, provider.Message{Key: id.String(), To: testPhone(0), Body: testBody(0)}); o.Kind != provider.Sent {
		t.Fatalf("the secondary did not take the message: %+v", o)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'queued', provider = 'primary', attempt_count = 1 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(ctx, streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id}), jetstream.WithMsgID(id.String())); err != nil {
		t.Fatal(err)
	}
	// Its first delivery's claim was lost too.
	cons, err := e.js.Consumer(ctx, streams.Stream, streams.Lanes[1].Consumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		_ = m.Nak()
	}
	big := breaker.Config{Failures: 1000}
	stop := e.startSender(senderOptions{cfg: sender.Config{Routes: []sender.Route{
		{Name: "primary", Provider: pa, Breaker: breaker.New(big)},
		{Name: "secondary", Provider: pb, Breaker: breaker.New(big)}}}})
	defer stop()
	rows := e.waitTerminal([]uuid.UUID{id}, 60*time.Second)
	if rows[id].status != outbox.StatusUnknown {
		t.Fatalf("row %s: %s (%s); want unknown (the secondary may have it and cannot be asked)", id, rows[id].status, rows[id].lastErr)
	}
	var seqs []uint64
	for _, m := range deadLetterFor(e.lettersOf([]uuid.UUID{id}, 30*time.Second), id) {
		seqs = append(seqs, m.Sequence)
	}
	letters, err := deadletter.BySequence(ctx, e.js, "", seqs)
	if err != nil || len(letters) == 0 {
		t.Fatalf("letters of %s: %v, %v", id, letters, err)
	}
	var res []store.ReplayResult
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		res, err = store.Replay(ctx, tx, []store.ReplayTarget{letters[len(letters)-1].ReplayTarget()}, store.ReplayOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Replayed || !res[0].NeedsForce {
		t.Errorf("replay of a row another provider may hold: %+v; want refused, needing -force", res)
	}
	// Had it been replayed, the relay would publish it and the primary
	// send it now.
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	if len(res) == 1 && res[0].Replayed {
		e.waitTerminal([]uuid.UUID{id}, 30*time.Second)
	}
	time.Sleep(time.Second)
	if a, b := e.stub.Deliveries()[id.String()].Deliveries, secondary.Deliveries()[id.String()].Deliveries; a+b != 1 {
		t.Errorf("deliveries at the primary %d, at the secondary %d; want the secondary's alone", a, b)
	}
}
