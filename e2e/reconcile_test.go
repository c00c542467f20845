package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
)

func (e *env) newReconciler(grace time.Duration) *relay.Reconciler {
	e.t.Helper()
	_, js := e.nats.Connect(e.t)
	r, err := relay.NewReconciler(relay.ReconcilerConfig{
		Pool: e.pool, JetStream: js, Interval: 100 * time.Millisecond, Grace: grace, Logger: e.logger(),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// updateConsumer changes the senders' consumer before the senders start.
func (e *env) updateConsumer(mutate func(*jetstream.ConsumerConfig)) {
	e.t.Helper()
	ctx := context.Background()
	c, err := e.js.Consumer(ctx, streams.Stream, streams.Consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	mutate(&cfg)
	if _, err := e.js.CreateOrUpdateConsumer(ctx, streams.Stream, cfg); err != nil {
		e.t.Fatal(err)
	}
}

// lose makes rows look as if the broker lost their message after the relay
// queued them: queued, delivered long ago, and nothing in the stream.
func (e *env) lose(ids []uuid.UUID) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET status = 'queued', stream_seq = 0,
		updated_at = now() - interval '1 hour', next_attempt_at = now() - interval '1 hour' WHERE id = ANY($1)`, ids); err != nil {
		e.t.Fatal(err)
	}
}

// A message the broker lost: the reconciler republishes it under a new
// generation (new Nats-Msg-Id, same Idempotency-Key) and it is sent once.
func TestReconcilerRepublishesLostMessages(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ids := e.insert(20)
	e.lose(ids)
	e.startSender(senderOptions{})
	// A long grace: the lost rows look an hour old, and a republished row
	// must not look stuck again while a slow machine is still sending it.
	e.background("reconciler", e.newReconciler(time.Minute).Run)
	rows := e.waitTerminal(ids, time.Minute)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			t.Fatalf("row %s ended %s", id, rows[id].status)
		}
		var gen int
		if err := e.pool.QueryRow(context.Background(), `SELECT publish_gen FROM sms_outbox WHERE id = $1`, id).Scan(&gen); err != nil || gen != 1 {
			t.Fatalf("row %s publish_gen = %d, %v; want 1", id, gen, err)
		}
	}
	e.checkOnce(ids, rows)
}

// A message that left the consumer at MaxDeliver without a dead letter (every
// delivery found the row leased by an attempt that then died): the
// reconciler republishes it, the stale lease is taken over with the same key,
// and the provider replays its answer.
func TestReconcilerRecoversMaxDeliverExit(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.updateConsumer(func(c *jetstream.ConsumerConfig) { c.MaxDeliver = 2 })
	ids := e.insert(1)
	if err := e.deliverDirectly(ids[0]); err != nil { // the dead attempt reached the provider
		t.Fatal(err)
	}
	ctx := context.Background()
	lease := 1500 * time.Millisecond
	// The attempt that died holds a fresh lease while both deliveries come.
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sending', attempt_count = 1, updated_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	data := wire.AppendEncode(nil, wire.Send{ID: ids[0]})
	if _, err := e.js.Publish(ctx, streams.SubjectSend, data, jetstream.WithMsgID(ids[0].String())); err != nil {
		t.Fatal(err)
	}
	// The attempt holding the lease stays alive (it keeps touching the row)
	// until the message has left the consumer, then dies.
	alive, stopAlive := context.WithCancel(ctx)
	defer stopAlive()
	go func() {
		for alive.Err() == nil {
			_, _ = e.pool.Exec(alive, `UPDATE sms_outbox SET updated_at = now() WHERE id = $1 AND status = 'sending'`, ids[0])
			time.Sleep(100 * time.Millisecond)
		}
	}()
	e.startSender(senderOptions{timeout: time.Second, cfg: sender.Config{Lease: lease}})
	testkit.WaitFor(t, 30*time.Second, "the message to leave the consumer", func() bool {
		c, err := e.js.Consumer(ctx, streams.Stream, streams.Consumer)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream >= 1
	})
	stopAlive()
	if r := e.row(ids[0]); r.status != outbox.StatusSending {
		t.Fatalf("row = %+v, want still sending (stuck) before the reconciler", r)
	}
	e.background("reconciler", e.newReconciler(2*time.Second).Run)
	rows := e.waitTerminal(ids, time.Minute)
	if r := rows[ids[0]]; r.status != outbox.StatusSent || r.attempts != 2 {
		t.Fatalf("row = %+v, want sent on attempt 2", r)
	}
	e.checkOnce(ids, rows)
}

// Stuck rows with no attempt left: a queued one whose every attempt
// failed is finalised dead (max_attempts) with its dead letter. One whose
// fate is open (an earlier attempt may have reached the provider, its last
// attempt never reported back, its lookup is pending) is republished for a
// sender to settle, never guessed unknown: at a provider without
// idempotency the sender asks, and the rows end as the provider says (sent
// where it has the message, dead where it has none), without a call.
func TestReconcilerFinalisesSpentRows(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
	ids := e.insert(4)
	failed, sending, maybe, lookup := ids[0], ids[1], ids[2], ids[3]
	ctx := context.Background()
	for id, mark := range map[uuid.UUID]string{failed: "", maybe: "maybe_accepted = true,", lookup: "maybe_accepted = true, lookup_pending = true,"} {
		if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'queued', attempt_count = 8, stream_seq = 0, `+mark+`
			updated_at = now() - interval '1 hour', next_attempt_at = now() - interval '1 hour' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sending', attempt_count = 8,
		updated_at = now() - interval '1 hour', next_attempt_at = now() - interval '1 hour' WHERE id = $1`, sending); err != nil {
		t.Fatal(err)
	}
	// The parked lookup's attempt had reached the provider.
	e.postDirect(lookup, 3)
	if _, err := e.newReconciler(time.Second).Pass(ctx); err != nil {
		t.Fatal(err)
	}
	rows := e.rows()
	if rows[failed].status != outbox.StatusDead {
		t.Fatalf("the spent row whose attempts all failed is %s, want dead", rows[failed].status)
	}
	var republished int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE id = ANY($1) AND publish_gen = 1`,
		[]uuid.UUID{sending, maybe, lookup}).Scan(&republished); err != nil {
		t.Fatal(err)
	}
	if republished != 3 {
		t.Fatalf("%d of the 3 spent rows of open fate republished; statuses %s, %s, %s", republished,
			rows[sending].status, rows[maybe].status, rows[lookup].status)
	}
	mine := deadLetterFor(e.deadLetters(), failed)
	if len(mine) != 1 || mine[0].Header.Get(wire.HeaderReason) != wire.ReasonMaxAttempts {
		t.Errorf("dead letters of the failed row: %v, want one with reason %s", mine, wire.ReasonMaxAttempts)
	}
	no := false
	e.startSender(senderOptions{idempotent: &no, lookup: true})
	rows = e.waitTerminal(ids, time.Minute)
	if !accepted(rows[lookup].status) || rows[sending].status != outbox.StatusDead || rows[maybe].status != outbox.StatusDead {
		t.Fatalf("after the lookups: %s, %s, %s; want the parked lookup settled by its message, the others dead (the provider has none)",
			rows[lookup].status, rows[sending].status, rows[maybe].status)
	}
	if d := e.stub.Deliveries()[lookup.String()]; d.Deliveries != 1 || e.stub.Stats().Deliveries != 1 {
		t.Fatalf("provider deliveries %d (all: %d), want only the one from before", d.Deliveries, e.stub.Stats().Deliveries)
	}
}

// Several reconcilers at once handle each stuck row once, and a row still
// behind a backlog in the stream is left alone.
func TestConcurrentReconcilersAndBacklog(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ids := e.insert(61)
	recreated := ids[60]
	ids = ids[:60]
	e.lose(ids[:50])
	// A row published to a stream that was since lost and recreated: its
	// sequence is beyond anything the new stream holds.
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET status = 'queued', stream_seq = 1000000,
		updated_at = now() - interval '1 hour', next_attempt_at = now() - interval '1 hour' WHERE id = $1`, recreated); err != nil {
		t.Fatal(err)
	}
	// The last 10 look old, but their publication is in the stream beyond
	// what the consumer has delivered (no sender runs): they are waiting in
	// a backlog, not lost.
	for _, id := range ids[50:] {
		ack, err := e.js.Publish(context.Background(), streams.SubjectSend, wire.AppendEncode(nil, wire.Send{ID: id}), jetstream.WithMsgID(id.String()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET status = 'queued', stream_seq = $2,
			updated_at = now() - interval '1 hour', next_attempt_at = now() - interval '1 hour' WHERE id = $1`, id, int64(ack.Sequence)); err != nil {
			t.Fatal(err)
		}
	}
	// The rows look an hour old; a long grace keeps a row republished by
	// one reconciler from looking stuck to another whose stream info
	// predates the republication.
	recs := []*relay.Reconciler{e.newReconciler(time.Minute), e.newReconciler(time.Minute), e.newReconciler(time.Minute)}
	var wg sync.WaitGroup
	for _, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n, err := r.Pass(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	stream := e.streamCounts()
	if stream[recreated] != 1 {
		t.Errorf("the row of a recreated stream was republished %d times, want 1", stream[recreated])
	}
	for _, id := range ids[:50] {
		if stream[id] != 1 {
			t.Errorf("row %s republished %d times, want 1", id, stream[id])
		}
	}
	for _, id := range ids[50:] {
		if stream[id] != 1 {
			t.Errorf("backlogged row %s is in the stream %d times, want its 1 original publication", id, stream[id])
		}
	}
}

// streamCounts counts the messages per row id in the SMS stream.
func (e *env) streamCounts() map[uuid.UUID]int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, streams.Stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[uuid.UUID]int{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatal(err)
		}
		if p, err := wire.Decode(m.Data); err == nil {
			out[p.ID]++
		}
	}
	return out
}

// An operator replay puts a dead row back through the pipeline with the same
// idempotency key and a new publish generation: it is not deduplicated away,
// and a second death gets its own dead letter.
func TestReplayGoesThroughThePipelineWithTheSameKey(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{FailRate: 1, FailStatus: 400, FailCode: 21211}}})
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	ids := e.insert(1)
	e.waitTerminal(ids, 30*time.Second)
	replay := func() {
		t.Helper()
		err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
			res, err := outbox.Replay(context.Background(), tx, []outbox.ReplayTarget{{ID: ids[0]}}, outbox.ReplayOptions{})
			if err == nil && (len(res) != 1 || !res[0].Replayed) {
				t.Fatalf("replay = %+v", res)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Still failing: dead again, a second dead letter (generation 1).
	replay()
	testkit.WaitFor(t, 30*time.Second, "the replayed row to die again", func() bool { return len(deadLetterFor(e.deadLetters(), ids[0])) == 2 })
	e.waitTerminal(ids, 30*time.Second)
	// The provider is fixed: the next replay is sent, under the same key.
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	replay()
	rows := e.waitTerminal(ids, 30*time.Second)
	if r := rows[ids[0]]; r.status != outbox.StatusSent {
		t.Fatalf("row = %+v, want sent", r)
	}
	d := e.stub.Deliveries()[ids[0].String()]
	if d.Deliveries != 1 || d.Requests != 3 {
		t.Fatalf("provider: %+v, want 3 requests under the row's key and 1 delivery", d)
	}
}
