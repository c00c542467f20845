package e2e

// The chaos matrix: each case runs the real relay and sender code (as
// subprocesses where a real SIGKILL is the point), a real Postgres, an
// embedded NATS server the test can stop and restart on the same store, the
// provider stub and in-process toxiproxy, and ends by checking I1-I3 on every
// row.

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/toxictest"
	"github.com/sendonce/sendonce/outbox"
)

// processEnv is the environment of a relay or sender subprocess on e.
func (e *env) processEnv(dbURL string, extra ...string) []string {
	return append([]string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + e.nats.URL(), "HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=debug",
		"SMS_API_BASE=" + e.stubURL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY=" + testAPIKey, "SMS_API_TIMEOUT=1s",
		"RETRY_BASE=20ms", "RETRY_CAP=200ms", "RELAY_POLL_INTERVAL=100ms", "SHUTDOWN_TIMEOUT=20s",
	}, extra...)
}

func (e *env) dbURL() string { return e.pool.Config().ConnString() }

// 1. The relay is SIGKILLed between the PubAcks and the queued write: its
// transaction rolls back, the restarted relay republishes, JetStream
// deduplicates, and each row is delivered once.
func TestChaosRelayKilledAfterPubAck(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	ids := e.insert(500)
	crashing := startProcess(t, "relay", e.processEnv(e.dbURL(), crashpoint.Env+"="+crashpoint.RelayAfterPubAck+"=1", "RELAY_BATCH_SIZE=200"))
	if err := crashing.waitExit(t, 60*time.Second); !crashing.KilledBy(syscall.SIGKILL) {
		t.Fatalf("relay exit: %v, want killed at its crash point", err)
	}
	// The crashing batch's 200 rows were all acknowledged before the kill; the
	// relay's other worker may have published some of its own batch too.
	if got := e.streamCounts(); len(got) < 200 {
		t.Fatalf("%d rows in the stream after the crash, want at least the 200 of the crashing batch", len(got))
	}
	var pending int
	_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = 'pending'`).Scan(&pending)
	if pending != len(ids) {
		t.Fatalf("%d rows pending after the crash, want all %d (rolled back)", pending, len(ids))
	}
	startProcess(t, "relay", e.processEnv(e.dbURL()))
	e.startSender(senderOptions{})
	e.checkInvariants(ids, 2*time.Minute)
	for id, n := range e.streamCounts() {
		if n != 1 {
			t.Fatalf("row %s is in the stream %d times: the republication was not deduplicated", id, n)
		}
	}
}

// 2. The relay republishes after the stream's Duplicates window (2 s window,
// 5 s stall): two copies in the stream, one delivery.
func TestChaosRepublishAfterDedupWindow(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, streams.Stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = 2 * time.Second
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	ids := e.insert(100)
	_, js := e.nats.Connect(t)
	r, err := relay.New(relay.Config{Pool: e.pool, JetStream: js, Logger: e.logger()})
	if err != nil {
		t.Fatal(err)
	}
	relay.SetAfterAcksForTest(r, func() error { return errors.New("stalled past the dedup window") })
	if _, err := r.RelayBatch(ctx); err == nil {
		t.Fatal("the stalled batch committed")
	}
	time.Sleep(5 * time.Second) // the stall: longer than the Duplicates window
	e.startRelay(relay.Config{})
	testkit.WaitFor(t, 30*time.Second, "the republication", func() bool {
		for _, n := range e.streamCounts() {
			if n != 2 {
				return false
			}
		}
		return true
	})
	e.startSender(senderOptions{})
	e.startSender(senderOptions{})
	e.checkInvariants(ids, time.Minute)
}

// 3. A sender is SIGKILLed after the provider accepted and before its status
// write. Idempotent provider: the attempt is replayed under the same key,
// one delivery. Provider without idempotency: unknown, zero resends.
func TestChaosSenderKilledAfterAccept(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{true, false} {
		name := "idempotent"
		if !idempotent {
			name = "not idempotent"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: !idempotent}})
			e.auditStatuses()
			e.updateConsumer(func(c *jetstream.ConsumerConfig) { c.AckWait = 2 * time.Second })
			e.startRelay(relay.Config{})
			ids := e.insert(30)
			flag := "SMS_API_IDEMPOTENT=true"
			if !idempotent {
				flag = "SMS_API_IDEMPOTENT=false"
			}
			extra := []string{flag, "SENDER_LEASE=2s", "SENDER_CONCURRENCY=4"}
			dying := startProcess(t, "sender", e.processEnv(e.dbURL(), append(extra, crashpoint.Env+"="+crashpoint.SenderAfterAccept+"=5")...))
			if err := dying.waitExit(t, 60*time.Second); !dying.KilledBy(syscall.SIGKILL) {
				t.Fatalf("sender exit: %v, want killed at its crash point", err)
			}
			startProcess(t, "sender", e.processEnv(e.dbURL(), extra...))
			rows := e.checkInvariants(ids, 2*time.Minute)
			deliveries := e.stub.Deliveries()
			unknown := 0
			for _, id := range ids {
				d := deliveries[id.String()]
				if !idempotent && d.Requests > 1 {
					t.Errorf("row %s: %d requests at a provider without idempotency", id, d.Requests)
				}
				if rows[id].status == outbox.StatusUnknown {
					unknown++
				}
			}
			if idempotent && unknown > 0 {
				t.Errorf("%d rows unknown at an idempotent provider", unknown)
			}
			if !idempotent && unknown == 0 {
				t.Error("no row unknown: the killed attempt's outcome cannot have been learned")
			}
		})
	}
}

// 4. Responses lost after the provider accepted, three ways: a stalled
// connection (timeout), a reset (reset_peer) and a truncated response
// (limit_data). Each: one delivery, row sent.
func TestChaosLostResponses(t *testing.T) {
	t.Parallel()
	toxics := map[string]map[string]any{
		"timeout":    {"timeout": 0},
		"reset_peer": {"timeout": 0},
		"limit_data": {"bytes": 40},
	}
	for typ, attrs := range toxics {
		t.Run(typ, func(t *testing.T) {
			t.Parallel()
			e := setup(t, envOptions{})
			e.auditStatuses()
			proxy := e.newProxy()
			proxy.Add("fault", typ, "downstream", attrs)
			e.startRelay(relay.Config{})
			e.startSender(senderOptions{baseURL: proxy.URL(), timeout: 300 * time.Millisecond})
			ids := e.insert(10)
			e.setBudget(ids, 100)
			testkit.WaitFor(t, 30*time.Second, "every message accepted and retried", func() bool {
				d := e.stub.Deliveries()
				for _, id := range ids {
					if d[id.String()].Deliveries != 1 || e.row(id).attempts < 2 {
						return false
					}
				}
				return true
			})
			proxy.Remove("fault")
			rows := e.checkInvariants(ids, time.Minute)
			for _, id := range ids {
				if rows[id].status != outbox.StatusSent {
					t.Errorf("row %s ended %s", id, rows[id].status)
				}
			}
		})
	}
}

// 5. One message delivered to two senders: sender A's heartbeats cannot
// reach the broker (partitioned) while the provider is slow, AckWait
// expires, sender B gets the message and finds A's lease: one delivery, one
// final status.
func TestChaosOneMessageTwoSenders(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{Latency: 3 * time.Second}}})
	e.auditStatuses()
	e.updateConsumer(func(c *jetstream.ConsumerConfig) { c.AckWait = time.Second })
	natsProxy := toxictest.New(t, strings.TrimPrefix(e.nats.URL(), "nats://"))
	e.startRelay(relay.Config{})
	startSenderVia(t, e, "nats://"+natsProxy.Addr(), 10*time.Second)
	ids := e.insert(1)
	testkit.WaitFor(t, 30*time.Second, "sender A to call the provider", func() bool { return e.stub.Stats().Requests == 1 })
	natsProxy.Disable() // A's InProgress heartbeats are lost from here on
	e.startSender(senderOptions{timeout: 10 * time.Second})
	testkit.WaitFor(t, 30*time.Second, "A's attempt to finish", func() bool { return e.row(ids[0]).status == outbox.StatusSent })
	natsProxy.Enable()
	e.checkInvariants(ids, time.Minute)
	if n := e.stub.Stats().Requests; n != 1 {
		t.Fatalf("provider got %d requests, want 1", n)
	}
}

// startSenderVia starts an in-process sender whose NATS connection goes to
// url (a proxy).
func startSenderVia(t *testing.T, e *env, url string, timeout time.Duration) {
	t.Helper()
	nc, js := connectURL(t, url)
	_ = nc
	prov, err := newProviderClient(e.stubURL, true)
	if err != nil {
		t.Fatal(err)
	}
	_ = timeout
	s, err := sender.New(sender.Config{Pool: e.pool, JetStream: js, Provider: prov, Logger: e.logger(),
		RetryBase: 20 * time.Millisecond, RetryCap: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.background("sender via proxy", s.Run)
}

// 6. A burst of 5xx: retried with the same key until the provider recovers.
func TestChaos5xxBurst(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{FailRate: 0.7, FailStatus: 502}}})
	e.auditStatuses()
	e.startRelay(relay.Config{})
	// A backoff whose first 8 steps outlast the 1 s burst: the burst is a
	// provider incident the retry budget is meant to ride out.
	e.startSender(senderOptions{cfg: sender.Config{RetryBase: 200 * time.Millisecond, RetryCap: 2 * time.Second}})
	ids := e.insert(200)
	time.Sleep(time.Second)
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	rows := e.checkInvariants(ids, time.Minute)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			t.Errorf("row %s ended %s after a 5xx burst", id, rows[id].status)
		}
	}
}

// 9. MaxDeliver reached while the provider keeps failing: the consumer's
// budget is not the row's. On the last delivery the sender parks the row in
// Postgres instead of a Nak that JetStream would drop, the reconciler
// republishes it under a new generation, and the row ends dead only when its
// own max_attempts are spent (one dead letter).
func TestChaosMaxDeliverExhausted(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{FailRate: 1, FailStatus: 503}}})
	e.auditStatuses()
	e.updateConsumer(func(c *jetstream.ConsumerConfig) { c.MaxDeliver = 3 })
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	e.background("reconciler", e.newReconciler(time.Minute).Run)
	ids := e.insert(5)
	rows := e.checkInvariants(ids, time.Minute)
	dls := e.lettersOf(ids, 30*time.Second)
	for _, id := range ids {
		if r := rows[id]; r.status != outbox.StatusDead || r.attempts != 8 {
			t.Errorf("row = %+v, want dead after its 8 attempts (MaxDeliver 3 < max_attempts 8)", r)
		}
		if n := len(deadLetterFor(dls, id)); n != 1 {
			t.Errorf("row %s: %d dead letters", id, n)
		}
	}
}

// 10. The broker restarts mid-stream (same store), then stays down for 30 s:
// nothing lost, nothing sent twice.
func TestChaosBrokerRestartAndOutage(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	e.startRelay(relay.Config{AckTimeout: 2 * time.Second})
	e.startSender(senderOptions{})
	e.startSender(senderOptions{})
	ids := e.insertSlowly(1500, 10*time.Second, func(i int) {
		switch i {
		case 300:
			e.nats.Restart()
		case 600:
			e.nats.Stop()
			time.Sleep(30 * time.Second)
			e.nats.Restart()
		}
	})
	e.checkInvariants(ids, 3*time.Minute)
}

// insertSlowly commits n rows one per transaction over about d, calling
// at(i) before row i (in the inserting goroutine).
func (e *env) insertSlowly(n int, d time.Duration, at func(i int)) []uuid.UUID {
	e.t.Helper()
	ids := make([]uuid.UUID, 0, n)
	ctx := context.Background()
	pause := d / time.Duration(n)
	for i := range n {
		if at != nil {
			at(i)
		}
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			id, err := outbox.Enqueue(ctx, tx, testPhone(i), testBody(i))
			ids = append(ids, id)
			return err
		})
		if err != nil {
			e.t.Fatal(err)
		}
		time.Sleep(pause)
	}
	return ids
}

// 11a. Postgres connections cut (toxiproxy in front of Postgres) again and
// again while rows are claimed and their statuses written.
func TestChaosPostgresConnectionsCut(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{Latency: 5 * time.Millisecond}}})
	e.auditStatuses()
	cfg := e.pool.Config().ConnConfig
	pgProxy := toxictest.New(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	proxied := strings.Replace(e.dbURL(), net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), pgProxy.Addr(), 1)
	if proxied == e.dbURL() {
		t.Fatalf("could not point %q at the proxy", e.dbURL())
	}
	pool, err := pgxpool.New(context.Background(), proxied)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	viaProxy := &env{t: t, pool: pool, nats: e.nats, js: e.js, stub: e.stub, stubURL: e.stubURL, logs: e.logs}
	viaProxy.startRelay(relay.Config{DBTimeout: 2 * time.Second})
	viaProxy.startSender(senderOptions{cfg: sender.Config{DBTimeout: 2 * time.Second}})
	viaProxy.startSender(senderOptions{cfg: sender.Config{DBTimeout: 2 * time.Second}})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	cuts := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(200+rand.IntN(400)) * time.Millisecond):
			}
			pgProxy.Disable()
			time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
			pgProxy.Enable()
			cuts++
		}
	}()
	ids := e.insertSlowly(600, 8*time.Second, nil) // the inserts go direct: the application is not under test
	close(stop)
	wg.Wait()
	t.Logf("cut Postgres connections %d times", cuts)
	e.checkInvariants(ids, 3*time.Minute)
}

// 12. The senders are partitioned from NATS for 30 s while the relay keeps
// publishing: afterwards everything is sent once.
func TestChaosSenderNATSPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	natsProxy := toxictest.New(t, strings.TrimPrefix(e.nats.URL(), "nats://"))
	e.startRelay(relay.Config{})
	startSenderVia(t, e, "nats://"+natsProxy.Addr(), 5*time.Second)
	startSenderVia(t, e, "nats://"+natsProxy.Addr(), 5*time.Second)
	ids := e.insertSlowly(600, 6*time.Second, func(i int) {
		if i == 200 {
			natsProxy.Disable()
			go func() {
				time.Sleep(30 * time.Second)
				natsProxy.Enable()
			}()
		}
	})
	e.checkInvariants(ids, 3*time.Minute)
}

// 14. Out-of-order commits: 50 writers whose transactions stay open for
// random times, so rows commit in another order than their created_at.
// Every row is published.
func TestChaosOutOfOrderCommits(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	e.auditStatuses()
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{})
	var mu sync.Mutex
	var ids []uuid.UUID
	var wg sync.WaitGroup
	ctx := context.Background()
	for w := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					id, err := outbox.Enqueue(ctx, tx, testPhone(w*10+i), testBody(w*10+i))
					if err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rows := e.checkInvariants(ids, 2*time.Minute)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			t.Errorf("row %s ended %s", id, rows[id].status)
		}
	}
}
