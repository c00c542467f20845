package flow_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/natstest"
	"github.com/sendonce/sendonce/internal/testkit"
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
	} {
		if _, err := flow.New(c); err == nil {
			t.Errorf("New(%s) passed", fmt.Sprintf("%+v", c))
		}
	}
}
