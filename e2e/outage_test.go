package e2e

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/toxictest"
	"github.com/sendonce/sendonce/internal/wire"
)

// The tests here hold I2 and I7 through outages: an outage of Postgres or of
// the dead-letter stream delays what the senders learned, it never turns it
// into unknown or dead, and never loses a message. They run at a provider
// without idempotency, where a mistaken "the sender died mid-call" would end
// a row unknown.

// viaPostgresProxy returns an env whose pool reaches Postgres through a
// toxiproxy, and the proxy: components started on it lose the database when
// the proxy is cut, while the test (e.pool) keeps a direct line.
func (e *env) viaPostgresProxy() (*env, *toxictest.Proxy) {
	e.t.Helper()
	cfg := e.pool.Config().ConnConfig
	direct := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	proxy := toxictest.New(e.t, direct)
	proxied := strings.Replace(e.dbURL(), direct, proxy.Addr(), 1)
	if proxied == e.dbURL() {
		e.t.Fatalf("could not point %q at the proxy", e.dbURL())
	}
	pcfg, err := outbox.PoolConfig(proxied, outbox.NoPooler)
	if err != nil {
		e.t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	return &env{t: e.t, pool: pool, nats: e.nats, js: e.js, stub: e.stub, stubURL: e.stubURL, logs: e.logs}, proxy
}

var notIdempotent = false

// requireAllSent asserts every row ended sent: no outcome the senders
// learned was lost to the outage.
func requireAllSent(t *testing.T, ids []uuid.UUID, rows map[uuid.UUID]row) {
	t.Helper()
	counts := map[outbox.State]int{}
	for _, id := range ids {
		counts[rows[id].status]++
	}
	if counts[outbox.StatusSent] != len(ids) {
		t.Fatalf("statuses %v; want all %d rows sent (nothing unknown, nothing dead)", counts, len(ids))
	}
}

// Postgres is cut for 45 s (a partition: connections hang) while rows are
// in flight at a provider without idempotency, and no process is killed:
// the senders keep every outcome they learned and write it when the
// database is back, holding their messages meanwhile. Every row ends sent,
// delivered once; none unknown, none dead.
func TestPostgresOutageKeepsKnownOutcomes(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true, Faults: smsstub.Faults{Latency: 100 * time.Millisecond}}})
	e.auditStatuses()
	via, proxy := e.viaPostgresProxy()
	via.startRelay(relay.Config{DBTimeout: 2 * time.Second})
	for range 2 {
		via.startSender(senderOptions{idempotent: &notIdempotent, cfg: sender.Config{DBTimeout: 2 * time.Second, ShutdownTimeout: time.Minute}})
	}
	via.background("reconciler", via.newReconciler(time.Minute).Run)

	cut := make(chan struct{})
	ids := e.insertSlowly(300, 4*time.Second, func(i int) {
		if i == 150 {
			// Both directions dropped: queries and answers vanish, as in a
			// partition, and every round trip runs into its timeout.
			proxy.Add("up", "timeout", "upstream", map[string]any{"timeout": 0})
			proxy.Add("down", "timeout", "downstream", map[string]any{"timeout": 0})
			close(cut)
		}
	})
	<-cut
	time.Sleep(45 * time.Second)
	proxy.Remove("up")
	proxy.Remove("down")
	rows := e.checkInvariants(ids, 3*time.Minute)
	requireAllSent(t, ids, rows)
}

// A claim commits and its answer is lost (the database's replies are
// dropped from the moment the claim runs, for longer than the lease and the
// ack deadline): the sender runs the claim again with the same token when
// the database answers, finds the rows it took, and sends them; nothing
// reads "a sender died mid-call", so no row ends unknown.
func TestLostClaimAnswerIsNotUnknown(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
	e.auditStatuses()
	ctx := context.Background()
	via, proxy := e.viaPostgresProxy()
	e.startRelay(relay.Config{}) // the relay is not under test: direct
	ids := e.insert(20)
	testkit.WaitFor(t, time.Minute, "the rows to be queued", func() bool {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE status = 'queued'`).Scan(&n)
		return err == nil && n == len(ids)
	})
	// Hold the rows, so that the sender's claim waits in Postgres while the
	// replies are cut; then let it run: it commits, and its answer is lost.
	lock, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := lock.Exec(ctx, `SELECT id FROM sms_outbox FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	via.startSender(senderOptions{idempotent: &notIdempotent, cfg: sender.Config{DBTimeout: 2 * time.Second, ShutdownTimeout: time.Minute}})
	testkit.WaitFor(t, time.Minute, "the sender's claim to wait for the rows", func() bool {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%claim_id%'`).Scan(&n)
		return err == nil && n > 0
	})
	proxy.Add("answers", "timeout", "downstream", map[string]any{"timeout": 0})
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, time.Minute, "the claim to commit without an answer", func() bool {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE status = 'sending' AND claim_id IS NOT NULL`).Scan(&n)
		return err == nil && n > 0
	})
	// Longer than the lease (15 s) and the consumer's ack deadline (30 s).
	time.Sleep(40 * time.Second)
	proxy.Remove("answers")
	rows := e.checkInvariants(ids, 2*time.Minute)
	requireAllSent(t, ids, rows)
	for _, id := range ids {
		if r := rows[id]; r.attempts != 1 {
			t.Errorf("row %s: %d attempts, want 1 (the claim run again is the same attempt)", id, r.attempts)
		}
	}
}

// Postgres refuses connections for 40 s while one message waits: the
// sender holds it and tries its claim again, spending none of the message's
// deliveries or the row's attempts, and sends it when the database is back.
// Before, each refused claim was a Nak: twenty of them and the message was
// gone from the consumer, or the row dead with "attempts exhausted (1 of 8)".
func TestRefusingPostgresSpendsNoDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
	e.auditStatuses()
	via, proxy := e.viaPostgresProxy()
	e.startRelay(relay.Config{})
	proxy.Disable()
	via.startSender(senderOptions{idempotent: &notIdempotent, cfg: sender.Config{DBTimeout: 2 * time.Second, ShutdownTimeout: time.Minute}})
	ids := e.insert(1)
	time.Sleep(40 * time.Second)
	proxy.Enable()
	rows := e.checkInvariants(ids, time.Minute)
	requireAllSent(t, ids, rows)
	if r := rows[ids[0]]; r.attempts != 1 {
		t.Fatalf("row = %+v, want sent on its first attempt", r)
	}
	cons, err := e.js.Consumer(context.Background(), streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := cons.Info(context.Background()); err != nil || info.NumRedelivered > 0 {
		t.Fatalf("consumer = %+v, %v; want no redelivery spent on the outage", info, err)
	}
}

// The dead-letter stream is away for 90 s (three ack deadlines) while
// undecodable messages arrive: each is held until its letter is stored, and
// ends in SMS_DLQ once the stream is back; none runs out of deliveries
// unlettered (I6).
func TestInvalidMessagesWaitForTheDeadLetterStream(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, streams.DeadLetterStream); err != nil {
		t.Fatal(err)
	}
	e.startSender(senderOptions{})
	const n = 5
	for i := range n {
		if _, err := e.js.Publish(ctx, streams.SubjectSend, []byte("not json "+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(90 * time.Second)
	e.nats.EnsureTopology(t)
	testkit.WaitFor(t, time.Minute, "the invalid messages' dead letters", func() bool {
		return len(e.deadLetters()) == n
	})
	for _, m := range e.deadLetters() {
		if m.Header.Get(wire.HeaderReason) != wire.ReasonInvalid {
			t.Errorf("letter %d: reason %q", m.Sequence, m.Header.Get(wire.HeaderReason))
		}
	}
	cons, err := e.js.Consumer(ctx, streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the invalid messages to be terminated", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
}

// A sender that died between a row's dead status and its dead letter leaves
// the row dead with no letter recorded: the reconciler publishes it, made
// from the row (its reason is the row's), once.
func TestReconcilerPublishesMissingLetters(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ids := e.insert(2)
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET status = 'unknown', end_reason = 'ambiguous',
		attempt_count = 1, last_error = 'no response', updated_at = now() - interval '1 hour' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET status = 'dead', end_reason = 'permanent',
		attempt_count = 1, letter_seq = 0, updated_at = now() - interval '1 hour' WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	r := e.newReconciler(time.Minute)
	for range 2 {
		if _, err := r.Pass(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	dls := e.deadLetters()
	if got := deadLetterFor(dls, ids[0]); len(got) != 1 || got[0].Header.Get(wire.HeaderReason) != wire.ReasonAmbiguous {
		t.Fatalf("letters of the unlettered row: %+v", got)
	}
	if got := deadLetterFor(dls, ids[1]); len(got) != 0 {
		t.Fatalf("a row with its letter recorded got another: %+v", got)
	}
	var seq *int64
	if err := e.pool.QueryRow(context.Background(), `SELECT letter_seq FROM sms_outbox WHERE id = $1`, ids[0]).Scan(&seq); err != nil || seq == nil || *seq == 0 {
		t.Fatalf("letter_seq = %v, %v; want the letter's sequence", seq, err)
	}
}
