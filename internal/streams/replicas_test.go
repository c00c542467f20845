package streams_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
)

func TestWithReplicas(t *testing.T) {
	t.Parallel()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 2, 4, 6, -1} {
		if _, err := topo.WithReplicas(n); err == nil {
			t.Errorf("WithReplicas(%d) accepted", n)
		}
	}
	for _, tc := range []struct{ n, stream, consumer int }{
		// At 1 the consumer follows its stream (0): a single server's
		// consumers were created that way, and stay unchanged.
		{1, 1, 0},
		{3, 3, 3},
		{5, 5, 5},
	} {
		r, err := topo.WithReplicas(tc.n)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range r.Streams {
			if s.Replicas != tc.stream {
				t.Errorf("WithReplicas(%d): stream %s has %d", tc.n, s.Name, s.Replicas)
			}
		}
		c, _ := r.Consumer(streams.Stream, streams.Consumer)
		if c.Replicas != tc.consumer {
			t.Errorf("WithReplicas(%d): consumer has %d, want %d", tc.n, c.Replicas, tc.consumer)
		}
	}
	// The original is untouched.
	if s, _ := topo.Stream(streams.Stream); s.Replicas != 1 {
		t.Errorf("WithReplicas changed its receiver: %d", s.Replicas)
	}
}

func TestVersionNote(t *testing.T) {
	t.Parallel()
	cases := []struct {
		version  string
		replicas int
		warn     bool
	}{
		{"2.10.22", 3, true},
		{"2.9.0", 5, true},
		{"v2.10.0-beta.1", 3, true},
		{"2.11.0", 3, false},
		{"2.15.2", 3, false},
		{"3.0.0", 3, false},
		{"2.10.22", 1, false}, // one copy: no leader to change
		{"", 3, false},        // unknown: no guess
		{"garbage", 3, false},
	}
	for _, c := range cases {
		if got := streams.VersionNote(c.version, c.replicas) != ""; got != c.warn {
			t.Errorf("VersionNote(%q, %d) warns = %v, want %v", c.version, c.replicas, got, c.warn)
		}
	}
}

// A single server cannot hold three replicas: the error names NATS_REPLICAS.
func TestEnsureReplicasOnSingleServer(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	topo, _ := streams.Default()
	r3, _ := topo.WithReplicas(3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := r3.Ensure(ctx, js)
	if err == nil || !strings.Contains(err.Error(), "NATS_REPLICAS=3 needs a JetStream cluster") {
		t.Fatalf("Ensure R3 on one server: %v", err)
	}
}

// On a 3-node cluster: the R1 topology a single-node deployment had is scaled
// up in place by NATS_REPLICAS=3, with its messages; a process started
// without it does not scale it back down; and a process that may not change
// the topology reports each difference.
func TestEnsureScalesUpInPlace(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	nc, err := nats.Connect(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r1, _ := streams.Default()
	r3, _ := r1.WithReplicas(3)
	if _, err := r1.EnsureWait(ctx, js); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		// A new stream's interest takes a moment to reach every node:
		// until then a publication finds no responder.
		waitFor(t, 10*time.Second, "a publication to be stored", func() bool {
			_, err := js.Publish(ctx, streams.SubjectSend, []byte("x"), jetstream.WithMsgID(fmt.Sprintf("m%d", i)))
			return err == nil
		})
	}
	diffs, err := r3.Verify(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	wantDiffs := []string{
		"stream SMS has 1 replica, NATS_REPLICAS=3",
		"stream SMS_DLQ has 1 replica, NATS_REPLICAS=3",
	}
	for _, c := range consumers(r1) {
		wantDiffs = append(wantDiffs, "consumer "+c+" has 1 replica, NATS_REPLICAS=3")
	}
	if !slices.Equal(diffs, wantDiffs) {
		t.Fatalf("Verify R3 on R1 = %q, want %q", diffs, wantDiffs)
	}

	changed, err := r3.EnsureWait(ctx, js)
	want := []string{
		"stream SMS updated (replicas 1 -> 3)",
		"stream SMS_DLQ updated (replicas 1 -> 3)",
	}
	for _, c := range consumers(r1) {
		want = append(want, "consumer "+c+" updated (replicas 0 -> 3)")
	}
	if err != nil || !slices.Equal(changed, want) {
		t.Fatalf("Ensure R3 over R1 = %q, %v; want %q", changed, err, want)
	}
	// The scale-up runs in the background: two new copies catch up.
	var info *jetstream.StreamInfo
	waitFor(t, time.Minute, "SMS to have three current copies", func() bool {
		s, err := js.Stream(ctx, streams.Stream)
		if err != nil {
			return false
		}
		info = s.CachedInfo()
		if info.Cluster == nil || info.Cluster.Desired != nil || len(info.Cluster.Replicas) != 2 {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current {
				return false
			}
		}
		return true
	})
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 || info.State.Msgs != 50 {
		t.Fatalf("SMS after the scale-up: replicas %d, cluster %+v, msgs %d", info.Config.Replicas, info.Cluster, info.State.Msgs)
	}
	if diffs, err := r3.Verify(ctx, js); err != nil || len(diffs) != 0 {
		t.Fatalf("Verify R3 after the scale-up = %q, %v", diffs, err)
	}
	if changed, err := r3.Ensure(ctx, js); err != nil || len(changed) != 0 {
		t.Fatalf("second Ensure R3 = %q, %v; want no change", changed, err)
	}

	// A stream the topology does not declare (a key-value bucket's) is
	// scaled up by ScaleUp, once.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"updated (replicas 1 -> 3)", ""} {
		if what, err := streams.ScaleUp(ctx, js, "KV_b", 3); err != nil || what != want {
			t.Fatalf("ScaleUp %d = %q, %v; want %q", i, what, err, want)
		}
	}
	if what, err := streams.ScaleUp(ctx, js, "KV_b", 1); err != nil || what != "" {
		t.Fatalf("ScaleUp to 1 = %q, %v; want no change", what, err)
	}

	// A process with the default NATS_REPLICAS=1 keeps the three copies.
	changed, err = r1.Ensure(ctx, js)
	want = []string{
		"stream SMS kept at 3 replicas (NATS_REPLICAS=1 never scales down)",
		"stream SMS_DLQ kept at 3 replicas (NATS_REPLICAS=1 never scales down)",
	}
	if err != nil || !slices.Equal(changed, want) {
		t.Fatalf("Ensure R1 over R3 = %q, %v; want %q", changed, err, want)
	}
	if s, err := js.Stream(ctx, streams.Stream); err != nil || s.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("SMS after an R1 start-up: %v", err)
	}
	if cons, err := js.Consumer(ctx, streams.Stream, streams.Consumer); err != nil || cons.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("consumer after an R1 start-up: %v", err)
	}
}

// Facts the relay relies on, on the pinned nats-server (>= 2.11): after the
// SMS leader is killed, a stream with three copies still deduplicates a
// publication it stored before the election (the dedup window survives a
// leader change), and while the election runs a request gets no answer at
// all (a timeout: the outcome is unknown, never a refusal). A keeper's pass
// during the election does not take it for a lost topology.
func TestLeaderChangeKeepsDedup(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r3, _ := streams.Default()
	r3, _ = r3.WithReplicas(3)
	if _, err := r3.EnsureWait(ctx, js); err != nil {
		t.Fatal(err)
	}
	keeper, err := streams.NewKeeper(streams.KeeperConfig{Topology: r3, JetStream: js, Ensure: true, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for twice := range 2 {
		id := fmt.Sprintf("row-%d", twice)
		waitFor(t, 10*time.Second, "a publication to be stored", func() bool {
			_, err := js.Publish(ctx, streams.SubjectSend, []byte(id), jetstream.WithMsgID(id))
			return err == nil
		})
		leader, err := c.StreamLeader(ctx, streams.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if err := leader.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		unanswered := 0
		for {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			keeper.Pass(rctx)
			rcancel()
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			ack, err := js.Publish(pctx, streams.SubjectSend, []byte(id), jetstream.WithMsgID(id))
			pcancel()
			if err != nil {
				if !streams.Unanswered(err) {
					t.Fatalf("publish during the election: %v, want no answer", err)
				}
				unanswered++
				continue
			}
			if !ack.Duplicate {
				t.Fatalf("publication %s retried across the leader change was stored again (seq %d)", id, ack.Sequence)
			}
			break
		}
		t.Logf("leader %s killed: %d publications unanswered; the retry %s after the kill was a duplicate", leader.Name, unanswered, time.Since(killed).Round(time.Millisecond))
		if err := leader.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, streams.Stream)
	if err != nil || s.CachedInfo().State.Msgs != 2 {
		t.Fatalf("SMS holds %d messages (%v), want 2", s.CachedInfo().State.Msgs, err)
	}
	if n := testutil.ToFloat64(keeper); n != 0 {
		t.Fatalf("the keeper recreated the topology %v times during leader elections", n)
	}
}

// consumers names every consumer of t as STREAM/NAME, in Ensure's order.
func consumers(t *streams.Topology) []string {
	var out []string
	for _, s := range slices.Sorted(maps.Keys(t.Consumers)) {
		for _, c := range t.Consumers[s] {
			out = append(out, s+"/"+c.Durable)
		}
	}
	return out
}

func TestPlacementPending(t *testing.T) {
	offline := &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}
	tooFew := &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, insufficient resources"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{offline, true},
		{fmt.Errorf("stream SMS: %w", offline), true},
		{tooFew, false},
		{&jetstream.APIError{Code: 500, ErrorCode: 10074}, false},
		{context.DeadlineExceeded, false},
	} {
		if got := streams.PlacementPending(tc.err); got != tc.want {
			t.Errorf("PlacementPending(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestCheckServerVersion(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{"2.9.25": false, "2.2.0": false, "v2.9.0": false, "2.10.0": true, "2.10.22": true,
		"v2.10.0-beta.1": true, "2.15.2": true, "3.0.0": true, "": true, "garbage": true} {
		err := streams.CheckServerVersion(v)
		if (err == nil) != ok {
			t.Errorf("CheckServerVersion(%q) = %v, want ok %v", v, err, ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "needs 2.10 or newer") || !strings.Contains(err.Error(), "bin/nats-server")) {
			t.Errorf("CheckServerVersion(%q) = %q: want the version needed and where to get one", v, err)
		}
	}
}

// A server that says it is 2.9 (the protocol's INFO line, over a real
// socket) is refused before any JetStream request, in one line.
func TestSetupRefusesAnOldServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "INFO {\"server_id\":\"old\",\"version\":\"2.9.25\",\"proto\":1,\"headers\":true,\"max_payload\":1048576,\"jetstream\":true}\r\n")
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "PING") {
						fmt.Fprint(c, "PONG\r\n")
					}
				}
			}()
		}
	}()
	nc, err := nats.Connect("nats://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = streams.Setup(ctx, js, streams.Settings{Ensure: true}, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), "nats-server 2.9.25 is too old: sendonce needs 2.10 or newer") {
		t.Fatalf("Setup on 2.9.25 = %v, want the refusal", err)
	}
}
