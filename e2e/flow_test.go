package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/flow"
	store "github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/outbox"
)

// Flow control: urgent messages go before a bulk backlog, bulk still gets its
// minimum share, one rate limit holds across sender processes, and a
// provider's pause holds every sender, none of it spending an attempt.

// insertWith commits n rows of priority p, 100 per transaction, with test
// numbers and bodies from index from on.
func (e *env) insertWith(p outbox.Priority, from, n int) []uuid.UUID {
	e.t.Helper()
	ids := make([]uuid.UUID, 0, n)
	ctx := context.Background()
	for len(ids) < n {
		msgs := make([]outbox.Message, 0, 100)
		for i := len(ids); i < n && len(msgs) < 100; i++ {
			msgs = append(msgs, outbox.Message{To: testPhone(from + i), Body: testBody(from + i), Priority: p})
		}
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			got, err := outbox.EnqueueBatch(ctx, tx, msgs)
			ids = append(ids, got...)
			return err
		})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	return ids
}

// countSent counts the rows of ids that are sent.
func (e *env) countSent(ids []uuid.UUID) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE id = ANY($1) AND status = 'sent'`, ids).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// noAttemptLost checks that every row's attempt count is its attempts that
// were not refused for the provider's rate (a 429 spends none).
func (e *env) noAttemptLost(ids []uuid.UUID) {
	e.t.Helper()
	bad, err := store.MiscountedAttempts(context.Background(), e.pool, ids)
	if err != nil {
		e.t.Fatal(err)
	}
	if bad > 0 {
		e.t.Fatalf("%d rows spent attempts on rate limiting", bad)
	}
}

var unlimited = 0.0

// Urgent messages enqueued behind a backlog of bulk ones are sent first: the
// relay publishes them to their lane, and the sender takes that lane first.
func TestUrgentOvertakesABulkBacklog(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{Latency: 10 * time.Millisecond}}})
	e.auditStatuses()
	limit := 100.0
	bulk := e.insertWith(outbox.Bulk, 0, 400)
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{flow: &limit, cfg: sender.Config{Concurrency: 8}})
	testkit.WaitFor(t, time.Minute, "the backlog to start", func() bool { return e.countSent(bulk) >= 40 })
	urgent := e.insertWith(outbox.Urgent, 1000, 20)
	testkit.WaitFor(t, time.Minute, "the urgent rows", func() bool { return e.countSent(urgent) == len(urgent) })
	bulkSent := e.countSent(bulk)
	t.Logf("all 20 urgent rows sent while %d of 400 bulk rows were", bulkSent)
	// At 100/s the backlog takes 4 s; the urgent rows must not wait for it.
	if bulkSent > 250 {
		t.Fatalf("the urgent rows were sent only after %d of 400 bulk rows", bulkSent)
	}
	e.checkInvariants(append(bulk, urgent...), 2*time.Minute)
}

// A continuous stream of urgent messages, faster than the rate limit, does
// not starve the bulk lane: it keeps its minimum share.
func TestBulkKeepsItsMinimumShare(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	limit := 100.0
	bulk := e.insertWith(outbox.Bulk, 0, 300)
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{flow: &limit, cfg: sender.Config{Concurrency: 8, BulkMinShare: 0.1}})
	testkit.WaitFor(t, time.Minute, "the backlog to start", func() bool { return e.countSent(bulk) >= 10 })
	// 600 urgent rows over 3 s: twice what the limit lets out.
	var urgent []uuid.UUID
	bulkBefore := e.countSent(bulk)
	for i := range 30 {
		urgent = append(urgent, e.insertWith(outbox.Urgent, 1000+20*i, 20)...)
		time.Sleep(100 * time.Millisecond)
	}
	bulkDuring, urgentDuring := e.countSent(bulk)-bulkBefore, e.countSent(urgent)
	share := float64(bulkDuring) / float64(bulkDuring+urgentDuring)
	t.Logf("while urgent rows kept coming: %d bulk and %d urgent sent (bulk share %.2f, minimum 0.10)", bulkDuring, urgentDuring, share)
	if share < 0.05 {
		t.Fatalf("bulk got %.2f of the sends under continuous urgent traffic, want about its minimum 0.10", share)
	}
	if urgentDuring < 3*bulkDuring {
		t.Fatalf("urgent %d vs bulk %d: urgent was not served first", urgentDuring, bulkDuring)
	}
	e.checkInvariants(append(bulk, urgent...), 2*time.Minute)
}

// Three sender processes share one SMS_RATE_LIMIT: the provider sees the
// limit, not three times it, and a provider limit just above it costs no
// attempt.
func TestRateLimitSharedByThreeSenderProcesses(t *testing.T) {
	t.Parallel()
	const limit = 40
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{RateLimit: limit * 1.1, RateBurst: 8}}})
	e.auditStatuses()
	ids := e.insert(320)
	e.startRelay(relay.Config{})
	env := []string{
		"DATABASE_URL=" + e.dbURL(), "NATS_URL=" + e.nats.URL(), "HTTP_ADDR=", "LOG_LEVEL=info",
		"SMS_API_BASE=" + e.stubURL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY=" + testAPIKey,
		"RETRY_BASE=50ms", "RETRY_CAP=500ms", fmt.Sprintf("SMS_RATE_LIMIT=%d", limit),
	}
	for range 3 {
		startProcess(t, "sender", env)
	}
	// Sample the provider's request count, and look at every 2 s window once
	// the three have found each other.
	var samples []int64
	var times []time.Time
	deadline := time.Now().Add(3 * time.Minute)
	for e.countSent(ids) < len(ids) && time.Now().Before(deadline) {
		samples = append(samples, e.stub.Stats().Requests)
		times = append(times, time.Now())
		time.Sleep(100 * time.Millisecond)
	}
	worst := 0.0
	for i := range samples {
		for j := i + 1; j < len(samples); j++ {
			if times[j].Sub(times[i]) >= 2*time.Second && samples[i] > 20 && samples[j] < int64(len(ids))-20 {
				rate := float64(samples[j]-samples[i]) / times[j].Sub(times[i]).Seconds()
				worst = max(worst, rate)
				break
			}
		}
	}
	stats := e.stub.Stats()
	t.Logf("3 sender processes, SMS_RATE_LIMIT=%d: the provider saw at most %.1f requests/s over 2 s; %d requests, %d refused over its limit", limit, worst, stats.Requests, stats.OverLimit)
	if worst > limit*1.15 {
		t.Fatalf("the provider saw %.1f requests/s over 2 s, above the shared limit %d", worst, limit)
	}
	if worst == 0 {
		t.Fatal("no window measured")
	}
	e.checkInvariants(ids, time.Minute)
	e.noAttemptLost(ids)
}

// One 429 with Retry-After pauses every sender, not only the one that got
// it, and the paused messages spend no attempt.
func TestProviderPauseHoldsEverySender(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{Latency: 20 * time.Millisecond}}})
	e.auditStatuses()
	e.startRelay(relay.Config{})
	for range 2 {
		e.startSender(senderOptions{flow: &unlimited, cfg: sender.Config{Concurrency: 4}})
	}
	type window struct {
		during int64
		err    error
	}
	measured := make(chan window, 1)
	ids := e.insertSlowly(400, 8*time.Second, func(i int) {
		if i != 100 {
			return
		}
		go func() {
			var w window
			defer func() { measured <- w }()
			if w.err = e.stub.SetFaults(smsstub.Faults{RateLimitRate: 1, RetryAfter: 2 * time.Second, Latency: 20 * time.Millisecond}); w.err != nil {
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for e.stub.Stats().RateLimited == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			limitedAt := time.Now()
			if w.err = e.stub.SetFaults(smsstub.Faults{Latency: 20 * time.Millisecond}); w.err != nil {
				return
			}
			// Requests already on their way may arrive for a moment; then
			// nothing until the pause ends.
			time.Sleep(300 * time.Millisecond)
			before := e.stub.Stats().Requests
			time.Sleep(time.Until(limitedAt.Add(1700 * time.Millisecond)))
			w.during = e.stub.Stats().Requests - before
		}()
	})
	w := <-measured
	if w.err != nil {
		t.Fatal(w.err)
	}
	if e.stub.Stats().RateLimited == 0 {
		t.Fatal("no 429 was answered")
	}
	if w.during > 0 {
		t.Fatalf("%d requests reached the provider during the 2 s pause it asked for", w.during)
	}
	e.checkInvariants(ids, 2*time.Minute)
	e.noAttemptLost(ids)
}

// Messages a sender has fetched wait behind the rate limit longer than the
// consumer's ack deadline, and stay its own: every one is held by
// heartbeats from the moment it arrives, so none is delivered a second
// time (the consumer delivers each message once), and the reconciler,
// running beside them, republishes none.
func TestThrottledMessagesStayHeld(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	const ackWait = time.Second
	e.updateConsumer(func(c *jetstream.ConsumerConfig) { c.AckWait = ackWait })
	ids := e.insert(10)
	e.startRelay(relay.Config{})
	// The grace outlasts the test: a row waits in the stream too, and the
	// reconciler counts that wait (docs/operations.md, reconciler).
	e.background("reconciler", e.newReconciler(30*time.Second).Run)
	// One request a second, and a sender that fetches four messages and
	// holds up to eight: most wait several seconds, past the ack deadline.
	limit := 1.0
	reg := prometheus.NewRegistry()
	e.startSender(senderOptions{flow: &limit, cfg: sender.Config{Concurrency: 4, ClaimBatch: 4, Registerer: reg}})
	rows := e.checkInvariants(ids, 2*time.Minute)
	for _, id := range ids {
		if r := rows[id]; r.status != outbox.StatusSent || r.attempts != 1 {
			t.Errorf("row %s ended %s after %d attempts, want sent after 1", id, r.status, r.attempts)
		}
	}
	c, err := e.js.Consumer(context.Background(), streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	info := c.CachedInfo()
	redelivered := counterValue(t, reg, "sendonce_sender_redeliveries_total")
	t.Logf("10 messages behind a limit of 1/s, ack deadline %s: %d deliveries, %v redeliveries seen by the sender", ackWait, info.Delivered.Consumer, redelivered)
	if info.Delivered.Consumer != uint64(len(ids)) || redelivered != 0 {
		t.Fatalf("%d deliveries of %d messages (%v seen again by the sender): a message waiting in the sender was not held", info.Delivered.Consumer, len(ids), redelivered)
	}
	var republished int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE id = ANY($1) AND publish_gen > 0`, ids).Scan(&republished); err != nil {
		t.Fatal(err)
	}
	if republished > 0 {
		t.Fatalf("%d rows republished by the reconciler while a sender held them", republished)
	}
}

// holdCount wraps a sender's Flow and counts the tokens it holds: taken and
// not given back.
type holdCount struct {
	sender.Flow
	held atomic.Int64
}

func (f *holdCount) Wait(ctx context.Context) error {
	err := f.Flow.Wait(ctx)
	if err == nil {
		f.held.Add(1)
	}
	return err
}

func (f *holdCount) TryTake() bool {
	ok := f.Flow.TryTake()
	if ok {
		f.held.Add(1)
	}
	return ok
}

func (f *holdCount) Return() {
	f.Flow.Return()
	f.held.Add(-1)
}

// A sender takes a token only for a message waiting: one that waits for
// work holds none. (One taken while idle would be spent on the next
// message, beside the tokens its share earns by then: a request over the
// limit after every idle spell.)
func TestAnIdleSenderHoldsNoToken(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	_, js := e.nats.Connect(t)
	lim, err := flow.New(flow.Config{JetStream: js, Create: true, ID: "idle_" + uuid.NewString()[:8], Logger: e.logger()})
	if err != nil {
		t.Fatal(err)
	}
	e.background("flow", lim.Run)
	counted := &holdCount{Flow: lim}
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{cfg: sender.Config{Concurrency: 1, Flow: counted}})
	ids := e.insert(5)
	e.checkInvariants(ids, time.Minute)
	if held, requests := counted.held.Load(), e.stub.Stats().Requests; held != requests {
		t.Fatalf("the sender took %d tokens for %d provider requests: it holds a token while idle", held, requests)
	}
}
