package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natscluster"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/outbox"
)

// The cluster tests run the relay and sender binaries against a JetStream
// cluster of nats-server processes (NATS_REPLICAS=3), kill nodes with
// SIGKILL while rows flow, and end checking I1, I2 and I3 on every row.
// make test runs a representative pair; make test-cluster runs them all
// (CLUSTER_TESTS=all).

// clusterTestsAll reports whether the longer cluster tests run.
func clusterTestsAll(t *testing.T) {
	t.Helper()
	if os.Getenv("CLUSTER_TESTS") != "all" {
		t.Skip("a longer cluster test: make test-cluster (CLUSTER_TESTS=all) runs it")
	}
}

// clusterRun is the pipeline as processes on a NATS cluster.
type clusterRun struct {
	*env
	nats     *natscluster.Cluster
	procEnv  []string
	relay    *process
	senders  []*process
	ctx      context.Context
	loadDone chan []uuid.UUID
}

type clusterOptions struct {
	nodes int            // default 3
	stub  smsstub.Faults // e.g. latency, to hold messages in flight
	extra []string       // more environment for both binaries
}

func startClusterRun(t *testing.T, o clusterOptions) *clusterRun {
	t.Helper()
	pool, url := pgtest.NewPool(t)
	nodes := cmpOr(o.nodes, 3)
	c := natstest.StartCluster(t, nodes)
	stub, err := smsstub.New(smsstub.Config{APIKey: testAPIKey, Faults: o.stub})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		_ = stub.Close()
	})
	e := &env{t: t, pool: pool, stub: stub, stubURL: hs.URL, logs: &logSink{t: t}}
	e.auditStatuses()
	replicas := "3"
	if nodes == 1 {
		replicas = "1"
	}
	r := &clusterRun{env: e, nats: c, ctx: context.Background()}
	r.procEnv = append([]string{
		"DATABASE_URL=" + url, "NATS_URL=" + c.URL(), "NATS_REPLICAS=" + replicas,
		"HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=info", "SHUTDOWN_TIMEOUT=20s",
		"SMS_API_BASE=" + hs.URL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY=" + testAPIKey,
		"SMS_API_TIMEOUT=5s", "RETRY_BASE=50ms", "RETRY_CAP=500ms", "SENDER_CONCURRENCY=32",
		"RELAY_POLL_INTERVAL=100ms", "RELAY_ACK_TIMEOUT=3s",
		// Above the consumer's 30s AckWait plus the 15s lease, as the
		// reconciler requires.
		"RECONCILE_INTERVAL=1s", "RECONCILE_GRACE=50s",
	}, o.extra...)
	// The relay first: it creates the R3 topology the senders look up.
	r.relay = startProcess(t, "relay", r.procEnv)
	r.waitLog(r.relay, `"msg":"relay started"`)
	for range 2 {
		s := startProcess(t, "sender", r.procEnv)
		r.waitLog(s, `"msg":"sender started"`)
		r.senders = append(r.senders, s)
	}
	return r
}

func (r *clusterRun) waitLog(p *process, marker string) {
	r.t.Helper()
	testkit.WaitFor(r.t, 60*time.Second, p.Name()+" to log "+marker, func() bool {
		if p.Exited() {
			r.t.Fatalf("%s exited: %v\n%s", p.Name(), p.Err(), p.logs.String())
		}
		return strings.Contains(p.logs.String(), marker)
	})
}

// load commits n rows, 20 per transaction, spread over d, in the
// background; finish returns their ids once all are committed.
func (r *clusterRun) load(n int, d time.Duration) {
	r.loadDone = make(chan []uuid.UUID, 1)
	go func() {
		ids := make([]uuid.UUID, 0, n)
		const per = 20
		gap := d / time.Duration((n+per-1)/per)
		for len(ids) < n {
			err := pgx.BeginFunc(r.ctx, r.pool, func(tx pgx.Tx) error {
				for i := 0; i < per && len(ids) < n; i++ {
					id, err := outbox.Enqueue(r.ctx, tx, testPhone(len(ids)), testBody(len(ids)))
					if err != nil {
						return err
					}
					ids = append(ids, id)
				}
				return nil
			})
			if err != nil {
				r.t.Errorf("load: %v", err)
				break
			}
			time.Sleep(gap)
		}
		r.loadDone <- ids
	}()
}

func (r *clusterRun) finishLoad() []uuid.UUID {
	r.t.Helper()
	select {
	case ids := <-r.loadDone:
		return ids
	case <-time.After(5 * time.Minute):
		r.t.Fatal("the load did not finish")
		return nil
	}
}

func (r *clusterRun) count(status string) int {
	var n int
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM sms_outbox WHERE status = $1`, status).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// waitFlowing waits until k more rows are sent than now: the pipeline
// moves (through whatever fault is in place).
func (r *clusterRun) waitFlowing(k int, what string) time.Duration {
	r.t.Helper()
	start := time.Now()
	base := r.count("sent")
	testkit.WaitFor(r.t, 2*time.Minute, fmt.Sprintf("%d more rows sent %s", k, what), func() bool {
		return r.count("sent") >= base+k
	})
	return time.Since(start)
}

// finish waits for every row, checks I1, I2 and I3, that every row ended
// sent, and that no process died.
func (r *clusterRun) finish(d time.Duration) {
	r.t.Helper()
	ids := r.finishLoad()
	rows := r.checkInvariants(ids, d)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			r.t.Errorf("row %s ended %s (%s)", id, rows[id].status, rows[id].lastErr)
		}
	}
	for _, p := range append([]*process{r.relay}, r.senders...) {
		if p.Exited() {
			r.t.Errorf("%s exited during the run: %v", p.Name(), p.Err())
		}
	}
	if len(r.nats.Nodes()) > 1 {
		r.checkOneMessagePerPublication()
		// Three copies survive one node's loss: a keeper that recreated
		// the topology would have mistaken an election for a loss.
		for _, p := range append([]*process{r.relay}, r.senders...) {
			if strings.Contains(p.logs.String(), "nats topology was missing") {
				r.t.Errorf("%s recreated the topology on a cluster that never lost it", p.Name())
			}
		}
	}
	if r.t.Failed() {
		for _, p := range append([]*process{r.relay}, r.senders...) {
			r.t.Logf("%s log:\n%s", p.Name(), p.logs.String())
		}
	}
}

// checkOneMessagePerPublication asserts that SMS holds one message per
// publication the rows record (generation 0, and one per republication):
// a publication retried across a leader change was deduplicated, not
// stored twice (the fix of nats-server 2.11). The senders' claim would hide
// a duplicate from I1; this would not.
func (r *clusterRun) checkOneMessagePerPublication() {
	r.t.Helper()
	var want int64
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) + coalesce(sum(publish_gen), 0) FROM sms_outbox`).Scan(&want); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	_, js := connectURL(r.t, r.nats.URL())
	s, err := js.Stream(ctx, streams.Stream)
	if err != nil {
		r.t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != uint64(want) {
		r.t.Errorf("SMS holds %d messages for %d publications: a retried publication was stored twice", got, want)
	}
}

// leaderOf returns the node leading the SMS stream (consumer false) or
// the senders' consumer.
func (r *clusterRun) leaderOf(consumer bool) *natscluster.Node {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	var n *natscluster.Node
	var err error
	if consumer {
		n, err = r.nats.ConsumerLeader(ctx, streams.Stream, streams.Consumer)
	} else {
		n, err = r.nats.StreamLeader(ctx, streams.Stream)
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// restart starts n again and waits until every node has caught up.
func (r *clusterRun) restart(n *natscluster.Node) time.Duration {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	if err := n.Start(ctx); err != nil {
		r.t.Fatal(err)
	}
	if err := r.nats.WaitHealthy(ctx); err != nil {
		r.t.Fatal(err)
	}
	return time.Since(start)
}

// kill9 kills n with SIGKILL.
func kill9(t *testing.T, n *natscluster.Node) {
	t.Helper()
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
}

// The SMS stream leader is killed with SIGKILL mid-run and restarted,
// twice. Publications in flight when it died get no PubAck: their rows
// stay pending and the relay publishes them again with the same
// Nats-Msg-Id, which the new leader deduplicates.
func TestClusterStreamLeaderKill(t *testing.T) {
	t.Parallel()
	r := startClusterRun(t, clusterOptions{})
	r.load(1500, 20*time.Second)
	r.waitFlowing(100, "before the first kill")
	for i := range 2 {
		leader := r.leaderOf(false)
		kill9(t, leader)
		took := r.waitFlowing(100, "with the SMS leader dead")
		back := r.restart(leader)
		t.Logf("kill %d: SMS leader %s SIGKILLed; 100 more rows sent %s later; restarted and caught up in %s",
			i+1, leader.Name, took.Round(time.Millisecond), back.Round(time.Millisecond))
	}
	r.finish(3 * time.Minute)
	t.Logf("the relay logged %d failed batches (PubAcks lost to the kills: their rows stayed pending and were published again)",
		strings.Count(r.relay.logs.String(), `"msg":"relay batch failed"`))
}

// The senders' consumer leader is killed while the senders hold messages
// in flight at a slow provider: their acks to the dead leader are lost, the
// new leader redelivers after AckWait, and the senders' claim finds the rows
// already sent.
func TestClusterConsumerLeaderKill(t *testing.T) {
	t.Parallel()
	r := startClusterRun(t, clusterOptions{stub: smsstub.Faults{Latency: 300 * time.Millisecond, LatencyJitter: 700 * time.Millisecond}})
	r.load(800, 10*time.Second)
	testkit.WaitFor(t, time.Minute, "senders to hold 20 messages in flight", func() bool { return r.count("sending") >= 20 })
	leader := r.leaderOf(true)
	inFlight := r.count("sending")
	kill9(t, leader)
	took := r.waitFlowing(100, "with the consumer leader dead")
	back := r.restart(leader)
	t.Logf("consumer leader %s SIGKILLed with %d rows in flight; 100 more rows sent %s later; restarted and caught up in %s",
		leader.Name, inFlight, took.Round(time.Millisecond), back.Round(time.Millisecond))
	r.finish(3 * time.Minute)
}

// Every node is stopped and started again in turn while rows flow, as an
// upgrade does it.
func TestClusterRollingRestart(t *testing.T) {
	clusterTestsAll(t)
	t.Parallel()
	r := startClusterRun(t, clusterOptions{})
	r.load(1500, 25*time.Second)
	r.waitFlowing(100, "before the restarts")
	for _, n := range r.nats.Nodes() {
		if err := n.Stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		took := r.waitFlowing(50, "with "+n.Name+" down")
		back := r.restart(n)
		t.Logf("%s stopped: 50 more rows sent %s later; restarted and caught up in %s", n.Name, took.Round(time.Millisecond), back.Round(time.Millisecond))
	}
	r.finish(3 * time.Minute)
}

// One node loses its disk: SIGKILL, its whole store deleted, restarted
// empty. It catches up from its peers (its replicas of SMS, SMS_DLQ and the
// consumer become current again) while rows flow, and nothing is lost.
func TestClusterNodeStoreLoss(t *testing.T) {
	clusterTestsAll(t)
	t.Parallel()
	r := startClusterRun(t, clusterOptions{})
	r.load(1500, 20*time.Second)
	r.waitFlowing(300, "before the loss")
	victim := r.leaderOf(false)
	kill9(t, victim)
	if err := victim.WipeStore(); err != nil {
		t.Fatal(err)
	}
	r.waitFlowing(100, "with "+victim.Name+" down")
	back := r.restart(victim) // healthy: every replica it holds is current
	t.Logf("%s (the SMS leader) lost its store; restarted empty and caught up in %s", victim.Name, back.Round(time.Millisecond))
	r.finish(3 * time.Minute)
	// Its copy holds what the others hold.
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	_, js := connectURL(t, victim.URL())
	s, err := js.Stream(ctx, streams.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range s.CachedInfo().Cluster.Replicas {
		if !p.Current {
			t.Errorf("replica %s of SMS is not current", p.Name)
		}
	}
}

// Store loss on a single server: nats-server SIGKILLed, its whole
// JetStream store deleted, restarted empty. The running relay and senders
// recreate the topology without a restart; rows still pending are
// published again, and rows the lost stream held (queued, not yet sent) are
// found by the reconciler (their stream_seq is beyond the new stream's last
// sequence, or behind its consumer) and republished under a new generation.
// Every row ends sent, once.
func TestStoreLossSingleServer(t *testing.T) {
	t.Parallel()
	// A slow provider, so that the stream holds a backlog when it is lost.
	r := startClusterRun(t, clusterOptions{nodes: 1, stub: smsstub.Faults{Latency: 200 * time.Millisecond, LatencyJitter: 300 * time.Millisecond},
		extra: []string{"SENDER_CONCURRENCY=8", "RECONCILE_GRACE=35s"}})
	node := r.nats.Nodes()[0]
	r.load(600, 8*time.Second)
	testkit.WaitFor(t, 3*time.Minute, "a backlog of queued rows", func() bool { return r.count("queued") >= 100 })
	queued := r.count("queued")
	kill9(t, node)
	if err := node.WipeStore(); err != nil {
		t.Fatal(err)
	}
	wiped := time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, js := connectURL(t, node.URL())
	testkit.WaitFor(t, time.Minute, "the topology to be recreated", func() bool {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		defer ccancel()
		_, err := js.Consumer(cctx, streams.Stream, streams.Consumer)
		return err == nil
	})
	t.Logf("store lost with %d rows queued; topology recreated %s after it", queued, time.Since(wiped).Round(time.Millisecond))
	r.waitFlowing(50, "after the store loss")
	t.Logf("50 more rows sent %s after the loss", time.Since(wiped).Round(time.Millisecond))
	r.finish(4 * time.Minute)
	var republished int
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM sms_outbox WHERE publish_gen > 0`).Scan(&republished); err != nil {
		t.Fatal(err)
	}
	t.Logf("all sent %s after the restart; %d rows republished by the reconciler", time.Since(wiped).Round(time.Millisecond), republished)
	for _, p := range append([]*process{r.relay}, r.senders...) {
		if !strings.Contains(p.logs.String(), "recreated it") {
			continue
		}
		return
	}
	t.Error("no process logged that it recreated the topology")
}
