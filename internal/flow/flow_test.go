package flow_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// limiter starts a Limiter on its own connection, as a sender process would,
// and stops it when the test ends.
func limiter(t *testing.T, srv *natstest.Server, id string, limit float64, demand *atomic.Int64) *flow.Limiter {
	t.Helper()
	_, js := srv.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	cfg := flow.Config{JetStream: js, Create: true, Limit: limit, ID: id, Heartbeat: 100 * time.Millisecond, LiveFor: time.Second}
	if demand != nil {
		cfg.Demand = func() int { return int(demand.Load()) }
	}
	l, err := flow.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return l
}

// drain takes tokens as fast as they come until stop, and returns how many.
func drain(l *flow.Limiter, stop <-chan struct{}) int {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-stop
		cancel()
	}()
	n := 0
	for l.Wait(ctx) == nil {
		n++
	}
	return n
}

// Three senders that all want more than the limit share it: together they
// never take more than the limit allows (rate times the time, plus the
// burst), and each gets a fair part.
func TestThreeSendersShareTheLimit(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	const limit = 150.0
	var demand atomic.Int64
	demand.Store(32) // every sender has a backlog
	ls := []*flow.Limiter{
		limiter(t, srv, "a", limit, &demand), limiter(t, srv, "b", limit, &demand), limiter(t, srv, "c", limit, &demand),
	}
	// Let them see each other before counting.
	time.Sleep(time.Second)
	stop := make(chan struct{})
	counts := make([]int, len(ls))
	var wg sync.WaitGroup
	start := time.Now()
	for i, l := range ls {
		wg.Go(func() { counts[i] = drain(l, stop) })
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	total := 0
	for _, n := range counts {
		total += n
	}
	// The burst, a token each in the air, and 5 % for the moments when the
	// senders' views of each other differ (a heartbeat late on a loaded
	// machine).
	allowed := limit*elapsed.Seconds()*1.05 + limit/10 + 3
	t.Logf("3 senders took %v = %d tokens in %s; the limit allows %.0f", counts, total, elapsed.Round(time.Millisecond), allowed)
	if float64(total) > allowed {
		t.Fatalf("%d tokens in %s exceed the shared limit %.0f/s (%.0f allowed)", total, elapsed, limit, allowed)
	}
	for i, n := range counts {
		if float64(n) < limit*elapsed.Seconds()/3*0.5 {
			t.Errorf("sender %d took %d tokens, under half its fair part", i, n)
		}
	}
}

// A sender that starts (or restarts) begins with an empty bucket and no
// share until it has seen the others: it never opens with a burst.
func TestAStartIsNoBurst(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	const limit = 100.0
	var demand atomic.Int64
	demand.Store(10)
	limiter(t, srv, "old", limit, &demand)
	time.Sleep(500 * time.Millisecond)
	fresh := limiter(t, srv, "fresh", limit, &demand)
	stop := make(chan struct{})
	var n int
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		n = drain(fresh, stop)
	}()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	elapsed := time.Since(start)
	// At most its share (half the limit) for the time, and one token.
	if allowed := limit/2*elapsed.Seconds() + 1; float64(n) > allowed {
		t.Fatalf("a fresh sender took %d tokens in %s, more than its share allows (%.0f): a burst", n, elapsed, allowed)
	}
}

// One sender's pause holds every sender.
func TestPauseIsShared(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	a := limiter(t, srv, "a", 0, nil)
	b := limiter(t, srv, "b", 0, nil)
	time.Sleep(500 * time.Millisecond)
	if !b.TryTake() {
		t.Fatal("an unlimited sender without a pause refused a token")
	}
	a.Pause(context.Background(), 1500*time.Millisecond)
	paused := time.Now()
	testkit.WaitFor(t, 5*time.Second, "the pause to reach the other sender", func() bool { return !b.TryTake() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(paused); waited < 1400*time.Millisecond {
		t.Fatalf("the other sender went on after %s of a 1.5s pause", waited)
	}
}

// A sender that starts after a shared pause ended reads the pause's end
// from the bucket, in the past: it goes on at once (a stale pause once
// made it add a negative time to its pause counter and panic, so a sender
// restarted after any 429 died at start-up).
func TestAStalePauseIsIgnored(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	a := limiter(t, srv, "a", 0, nil)
	time.Sleep(300 * time.Millisecond)
	a.Pause(context.Background(), 50*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	late := limiter(t, srv, "late", 0, nil)
	time.Sleep(500 * time.Millisecond)
	if !late.TryTake() {
		t.Fatal("a sender started after the pause ended is paused")
	}
}

// A sender that loses the shared state keeps to the limit divided by the
// senders it last saw: slower, never unlimited.
func TestFallbackShareWhenTheBucketIsGone(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	const limit = 90.0
	var demand atomic.Int64
	demand.Store(5)
	ls := []*flow.Limiter{limiter(t, srv, "a", limit, &demand), limiter(t, srv, "b", limit, &demand), limiter(t, srv, "c", limit, &demand)}
	time.Sleep(time.Second)
	srv.Stop()
	time.Sleep(1500 * time.Millisecond) // past LiveFor
	stop := make(chan struct{})
	var n int
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		n = drain(ls[0], stop)
	}()
	time.Sleep(2 * time.Second)
	close(stop)
	<-done
	elapsed := time.Since(start)
	allowed := limit/3*elapsed.Seconds() + limit/10 + 1
	t.Logf("cut off from the bucket, one of three senders took %d tokens in %s (its fallback share allows %.0f)", n, elapsed, allowed)
	if float64(n) > allowed {
		t.Fatalf("%d tokens in %s: more than limit/3 (%.0f allowed)", n, elapsed, allowed)
	}
	if n == 0 {
		t.Fatal("no token at all without the bucket: the fallback should send at limit/3")
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	for _, c := range []flow.Config{
		{Limit: 1, ID: "x"},
		{JetStream: js, Limit: 1},
		{JetStream: js, Limit: 1, ID: "a.b"},
		{JetStream: js, Limit: -1, ID: "x"},
		{JetStream: js, Limit: 1, ID: "x", ExpectedSenders: -1},
	} {
		if _, err := flow.New(c); err == nil {
			t.Errorf("New(%s) passed", fmt.Sprintf("%+v", c))
		}
	}
}

// gauge reads the value of the gauge name from reg; -1 when it is missing.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// grants records the time of every token the limiters grant.
type grants struct {
	mu    sync.Mutex
	times []time.Time
}

// take takes tokens from l as fast as they come until ctx is done, and
// records each.
func (g *grants) take(ctx context.Context, l *flow.Limiter) {
	for l.Wait(ctx) == nil {
		g.mu.Lock()
		g.times = append(g.times, time.Now())
		g.mu.Unlock()
	}
}

// busiestSecond returns the most grants in any one-second window, and
// when that window starts.
func (g *grants) busiestSecond() (int, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := slices.SortedFunc(slices.Values(g.times), time.Time.Compare)
	most, at := 0, time.Time{}
	for i, j := 0, 0; i < len(ts); i++ {
		for j < len(ts) && ts[j].Sub(ts[i]) < time.Second {
			j++
		}
		if j-i > most {
			most, at = j-i, ts[i]
		}
	}
	return most, at
}

// Senders that idled together and then all get work at the same moment
// keep to the shared limit in every one-second window, burst included:
// none of them spends more than its part before the others have seen its
// demand. The senders run with the default heartbeat, started at spread
// moments as separate processes would be, and the default burst (a tenth
// of the limit), so a window of the limit plus 10 % is all the provider
// may see.
func TestIdleSendersWakingTogetherKeepTheLimit(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	const (
		n     = 4
		limit = 200.0
	)
	type sender struct {
		l      *flow.Limiter
		reg    *prometheus.Registry
		demand atomic.Int64
	}
	senders := make([]*sender, n)
	var heartbeat time.Duration
	for i := range senders {
		s := &sender{reg: prometheus.NewRegistry()}
		_, js := srv.Connect(t)
		l, err := flow.New(flow.Config{
			JetStream: js, Create: true, Limit: limit, ID: fmt.Sprintf("s%d", i),
			Demand: func() int { return int(s.demand.Load()) }, Registerer: s.reg,
		})
		if err != nil {
			t.Fatal(err)
		}
		s.l = l
		senders[i] = s
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = l.Run(ctx)
		}()
		t.Cleanup(func() {
			cancel()
			<-done
		})
		// Spread the senders' heartbeats over one period, as processes
		// started apart have them (the default period is 500 ms).
		heartbeat = 500 * time.Millisecond
		time.Sleep(heartbeat / n)
	}
	testkit.WaitFor(t, 20*time.Second, "every sender to see the others and take its share", func() bool {
		for _, s := range senders {
			if gauge(t, s.reg, "sendonce_sender_rate_senders") != n || gauge(t, s.reg, "sendonce_sender_rate_share") <= 0 {
				return false
			}
		}
		return true
	})
	// An idle spell of a few heartbeats: every bucket fills to its part of
	// the burst.
	time.Sleep(4 * heartbeat)

	var g grants
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	for _, s := range senders {
		s.demand.Store(50)
		wg.Go(func() { g.take(ctx, s.l) })
	}
	time.Sleep(3 * time.Second) // the measurement: three seconds of work
	cancel()
	wg.Wait()
	most, at := g.busiestSecond()
	t.Logf("%d idle senders woken together took %d tokens in %s; the busiest second (from +%s) held %d, %.2fx the limit %.0f/s",
		n, len(g.times), time.Since(start).Round(time.Millisecond), at.Sub(start).Round(time.Millisecond), most, float64(most)/limit, limit)
	if float64(most) > 1.1*limit {
		t.Fatalf("%d tokens in one second: more than the limit %.0f/s plus 10 %% (burst included)", most, limit)
	}
	if len(g.times) < int(limit) {
		t.Fatalf("only %d tokens in 3 s: the senders did not take the limit", len(g.times))
	}
}

// A sender that starts while the shared bucket is out of reach (here: it
// is missing and the sender may not create it) does not take the whole
// limit: it keeps to the limit divided by the senders it expects (three
// by default) until the bucket is there, then shares it as usual.
func TestStartWithoutTheBucketTakesAPart(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	const limit = 90.0
	_, js := srv.Connect(t)
	reg := prometheus.NewRegistry()
	l, err := flow.New(flow.Config{
		JetStream: js, Bucket: "flow_not_there_yet", Limit: limit, ID: "lone",
		Heartbeat: 100 * time.Millisecond, LiveFor: time.Second,
		Demand: func() int { return 10 }, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	testkit.WaitFor(t, 10*time.Second, "the fallback share", func() bool { return gauge(t, reg, "sendonce_sender_rate_fallback") == 1 })
	stop := make(chan struct{})
	var taken int
	drained := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(drained)
		taken = drain(l, stop)
	}()
	time.Sleep(2 * time.Second) // the measurement
	close(stop)
	<-drained
	elapsed := time.Since(start)
	// A third of the limit for the time, its bucket (a third of the burst
	// above one token, plus that token) and one token in the air.
	allowed := limit/3*elapsed.Seconds() + 1 + (limit/10-3)/3 + 1
	t.Logf("started without the bucket, a sender took %d tokens in %s (a third of the limit allows %.0f; the whole limit %.0f)",
		taken, elapsed.Round(time.Millisecond), allowed, limit*elapsed.Seconds())
	if float64(taken) > allowed {
		t.Fatalf("%d tokens in %s without the shared state: more than a third of the limit (%.0f allowed)", taken, elapsed, allowed)
	}
	if taken == 0 {
		t.Fatal("no token at all without the bucket: the fallback should send at a third of the limit")
	}
	if _, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "flow_not_there_yet", Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the shared state once the bucket is there", func() bool {
		return gauge(t, reg, "sendonce_sender_rate_fallback") == 0 && gauge(t, reg, "sendonce_sender_rate_senders") == 1
	})
}

// Each heartbeat carries the sender's provider circuits, and ReadCircuits
// counts them over the live senders.
func TestHeartbeatsCarryTheCircuits(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	states := map[string]map[string]string{
		"a": {"twilio": "open", "vonage": "closed"},
		"b": {"twilio": "closed", "vonage": "closed"},
	}
	for id, st := range states {
		_, js := srv.Connect(t)
		l, err := flow.New(flow.Config{JetStream: js, Create: true, ID: id, Heartbeat: 100 * time.Millisecond, LiveFor: time.Second,
			Circuits: func() map[string]string { return st }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = l.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	nc, _ := srv.Connect(t)
	want := []flow.Circuit{{Provider: "twilio", Closed: 1, Open: 1}, {Provider: "vonage", Closed: 2}}
	var got []flow.Circuit
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var err error
		if got, err = flow.ReadCircuits(context.Background(), nc, "", 5*time.Second); err == nil && slices.Equal(got, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("circuits %+v; want %+v", got, want)
}
