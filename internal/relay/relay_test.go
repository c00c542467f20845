package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	internaloutbox "github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgbouncer"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

type env struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	nats *natstest.Server
}

func setup(t *testing.T) *env {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	return &env{pool: pool, js: js, nats: srv}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func (e *env) newRelay(t *testing.T, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Pool, cfg.JetStream = e.pool, e.js
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	cfg.PollInterval = max(cfg.PollInterval, 50*time.Millisecond)
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// insert commits n rows in batches, as applications would.
func (e *env) insert(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, 0, n)
	ctx := context.Background()
	for len(ids) < n {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for i := 0; i < 100 && len(ids) < n; i++ {
				id, err := outbox.Enqueue(ctx, tx, fmt.Sprintf("+1555%07d", len(ids)), "test message")
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func (e *env) countStatus(t *testing.T, status outbox.State) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = $1`, status).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// streamIDs returns the row ids of every message in the SMS stream, with
// their counts.
func (e *env) streamIDs(t *testing.T) map[uuid.UUID]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, streams.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get msg %d: %v", seq, err)
		}
		p, err := wire.Decode(m.Data)
		if err != nil {
			t.Fatalf("msg %d: %v", seq, err)
		}
		out[p.ID]++
	}
	return out
}

func run(t *testing.T, r *relay.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestRelayPublishesEveryRowOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	run(t, e.newRelay(t, relay.Config{BatchSize: 100, PublishWindow: 16, Registerer: reg}))
	ids := e.insert(t, 1000)
	testkit.WaitFor(t, 30*time.Second, "all rows queued", func() bool { return e.countStatus(t, outbox.StatusQueued) == len(ids) })
	got := e.streamIDs(t)
	if len(got) != len(ids) {
		t.Fatalf("stream holds %d distinct ids, want %d", len(got), len(ids))
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("row %s is in the stream %d times", id, got[id])
		}
	}
}

func TestTwoRelaysPublishEachRowOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insert(t, 2000) // written before the relays start: all workers race for them
	run(t, e.newRelay(t, relay.Config{BatchSize: 50, Workers: 3}))
	run(t, e.newRelay(t, relay.Config{BatchSize: 50, Workers: 4}))
	more := e.insert(t, 1000) // and while they run
	ids = append(ids, more...)
	testkit.WaitFor(t, 60*time.Second, "all rows queued", func() bool { return e.countStatus(t, outbox.StatusQueued) == len(ids) })
	got := e.streamIDs(t)
	total := 0
	for _, n := range got {
		total += n
	}
	if total != len(ids) || len(got) != len(ids) {
		t.Fatalf("stream holds %d messages for %d ids, want %d each", total, len(got), len(ids))
	}
}

// A crash between the PubAcks and the queued write: the transaction rolls
// back, the rows are pending again, and the next publication of each is a
// JetStream duplicate, so the stream still holds each row once.
func TestCrashBetweenPubAckAndQueuedWrite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insert(t, 500)
	var crashes atomic.Int32
	crashing := e.newRelay(t, relay.Config{BatchSize: 100})
	relay.SetAfterAcksForTest(crashing, func() error {
		crashes.Add(1)
		return errors.New("simulated crash after PubAck")
	})
	ctx := context.Background()
	for range 3 {
		if _, err := crashing.RelayBatch(ctx); err == nil {
			t.Fatal("RelayBatch succeeded through the crash hook")
		}
	}
	if n := e.countStatus(t, outbox.StatusPending); n != len(ids) {
		t.Fatalf("%d rows pending after the crashes, want all %d", n, len(ids))
	}
	if got := e.streamIDs(t); len(got) != 100 {
		t.Fatalf("stream holds %d ids after three crashed batches of the same 100 rows, want 100", len(got))
	}

	// A relay restarted after the crash finishes the job.
	run(t, e.newRelay(t, relay.Config{BatchSize: 100}))
	testkit.WaitFor(t, 30*time.Second, "all rows queued", func() bool { return e.countStatus(t, outbox.StatusQueued) == len(ids) })
	got := e.streamIDs(t)
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("row %s is in the stream %d times, want 1", id, got[id])
		}
	}
	if crashes.Load() != 3 {
		t.Fatalf("crash hook ran %d times", crashes.Load())
	}
}

// The relay survives a broker restart: rows written during the outage are
// published after it, none is lost.
func TestRelaySurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	run(t, e.newRelay(t, relay.Config{BatchSize: 100, AckTimeout: time.Second}))
	first := e.insert(t, 200)
	testkit.WaitFor(t, 30*time.Second, "first rows queued", func() bool { return e.countStatus(t, outbox.StatusQueued) == len(first) })
	e.nats.Stop()
	second := e.insert(t, 200)
	time.Sleep(300 * time.Millisecond) // let the relay fail against the dead broker
	e.nats.Restart()
	testkit.WaitFor(t, 60*time.Second, "rows written during the outage queued", func() bool {
		return e.countStatus(t, outbox.StatusQueued) == len(first)+len(second)
	})
	got := e.streamIDs(t)
	for _, id := range append(first, second...) {
		if got[id] != 1 {
			t.Fatalf("row %s is in the stream %d times, want 1", id, got[id])
		}
	}
}

// waitListening waits until a relay holds its LISTEN.
func (e *env) waitListening(t *testing.T) {
	t.Helper()
	testkit.WaitFor(t, 20*time.Second, "the relay to LISTEN", func() bool {
		var n int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN sms_outbox'`).Scan(&n)
		return err == nil && n == 1
	})
}

// LISTEN wakes the relay long before its poll interval.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	run(t, e.newRelay(t, relay.Config{PollInterval: time.Hour}))
	e.waitListening(t)
	// Let the relay's first (empty) batch and its wake-on-connect pass, so
	// only a notification can move the next row.
	testkit.WaitFor(t, 20*time.Second, "an idle relay", func() bool { return e.countStatus(t, outbox.StatusPending) == 0 })
	ids := e.insert(t, 1)
	testkit.WaitFor(t, 20*time.Second, "row queued without polling", func() bool { return e.countStatus(t, outbox.StatusQueued) == len(ids) })
}

// Insert transactions that notify within the linger start one batch
// between them, not one each: at a moderate rate a batch per notification
// was a batch of one or two rows, each paying whole statements and a
// commit.
func TestNotificationsGatherIntoOneBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	const linger = time.Second
	run(t, e.newRelay(t, relay.Config{PollInterval: time.Hour, Linger: linger, Registerer: reg}))
	e.waitListening(t)
	time.Sleep(100 * time.Millisecond) // the wake-on-connect batch, empty
	const n = 20
	start := time.Now()
	for range n {
		e.insert(t, 1) // a transaction, a notification
		time.Sleep(10 * time.Millisecond)
	}
	// The inserts take ~0.3 s, but on a loaded machine under -race they
	// can outlast the linger; each linger they span may end in a batch.
	// One more if the first insert came as the wake-on-connect linger
	// ended. A batch per notification would be 20.
	limit := 2 + uint64(time.Since(start)/linger)
	testkit.WaitFor(t, 20*time.Second, "rows queued", func() bool { return e.countStatus(t, outbox.StatusQueued) == n })
	if batches := batchesWithRows(t, reg); batches > limit {
		t.Fatalf("%d notifications over %d lingers started %d batches, want at most %d", n, limit-1, batches, limit)
	}
}

// sendonce.notify = off, for the inserting session (or its role or
// database), leaves the insert trigger's notification out: notifying
// transactions commit one at a time, and a busy application may rather
// have the relays poll.
func TestNotifySettingOff(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	listener, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+relay.Channel); err != nil {
		t.Fatal(err)
	}
	notified := func() bool {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := listener.WaitForNotification(wctx)
		return err == nil
	}
	insert := func(setting string) {
		t.Helper()
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('sendonce.notify', $1, true)`, setting); err != nil {
				return err
			}
			_, err := outbox.Enqueue(ctx, tx, "+15550000001", "test message")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	insert("off")
	if notified() {
		t.Fatal("an insert with sendonce.notify = off notified")
	}
	insert("")
	if !notified() {
		t.Fatal("an insert with sendonce.notify unset did not notify")
	}
}

// batchesWithRows reads how many batches claimed rows from the relay's
// sendonce_relay_batch_rows histogram.
func batchesWithRows(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sendonce_relay_batch_rows" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no sendonce_relay_batch_rows metric")
	return 0
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bad := []relay.Config{
		{Pool: e.pool},
		{JetStream: e.js},
		{Pool: e.pool, JetStream: e.js, BatchSize: -1},
		{Pool: e.pool, JetStream: e.js, PollInterval: time.Millisecond},
		{Pool: e.pool, JetStream: e.js, PublishWindow: -5},
		{Pool: e.pool, JetStream: e.js, Workers: -1},
		{Pool: e.pool, JetStream: e.js, Workers: 65},
		{Pool: e.pool, JetStream: e.js, Linger: 2 * time.Second},
	}
	for i, cfg := range bad {
		if _, err := relay.New(cfg); err == nil {
			t.Errorf("config %d accepted", i)
		}
	}
}

// A LISTEN through a transaction pooler succeeds and hears nothing: the
// relay finds out with its own notification, says so once, and polls every
// PollAlone; rows still move.
func TestSilentListenFallsBackToPolling(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := pgbouncer.ForTest(t, pgbouncer.Config{Mode: pgbouncer.Transaction, PoolSize: 2})
	listen, err := internaloutbox.ConnConfig(b.URL("postgres", e.pool.Config().ConnConfig.Database), internaloutbox.TransactionPooler)
	if err != nil {
		t.Fatal(err)
	}
	var logs testkit.Buffer
	reg := prometheus.NewRegistry()
	run(t, e.newRelay(t, relay.Config{PollInterval: time.Hour, PollAlone: 100 * time.Millisecond, Listen: listen,
		ListenProbe: 500 * time.Millisecond, Registerer: reg, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}))
	testkit.WaitFor(t, 20*time.Second, "the relay to give its LISTEN up", func() bool {
		return strings.Contains(logs.String(), "LISTEN hears no notification")
	})
	if v := gaugeValue(t, reg, "sendonce_relay_listening"); v != 0 {
		t.Fatalf("sendonce_relay_listening = %v while the relay polls", v)
	}
	ids := e.insert(t, 5)
	testkit.WaitFor(t, 20*time.Second, "rows queued by polling", func() bool { return e.countStatus(t, outbox.StatusQueued) == len(ids) })
	if n := strings.Count(logs.String(), "LISTEN hears no notification"); n != 1 {
		t.Fatalf("said %d times, want once", n)
	}
}

// A LISTEN that works is said so by the gauge.
func TestListeningGauge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	run(t, e.newRelay(t, relay.Config{Registerer: reg}))
	testkit.WaitFor(t, 20*time.Second, "the relay to hear its LISTEN", func() bool {
		return gaugeValue(t, reg, "sendonce_relay_listening") == 1
	})
}

func gaugeValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
