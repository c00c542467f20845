package breaker

import (
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func call(t *testing.T, b *Breaker, ok bool) {
	t.Helper()
	if !b.Admit() {
		t.Fatalf("call refused in state %s", b.State())
	}
	b.Done(ok)
}

func TestOpensAfterFailuresInARow(t *testing.T) {
	c := &clock{now: time.Unix(1e9, 0)}
	var changes []State
	b := New(Config{Failures: 3, OpenFor: time.Second, Now: c.Now, OnChange: func(s State) { changes = append(changes, s) }})
	call(t, b, false)
	call(t, b, false)
	call(t, b, true) // an answer in between starts the count again
	call(t, b, false)
	call(t, b, false)
	if b.State() != Closed {
		t.Fatalf("state %s after 2 failures in a row; want closed", b.State())
	}
	call(t, b, false)
	if b.State() != Open || b.Admit() || b.Ready() {
		t.Fatalf("state %s after 3 failures in a row: want open, admitting nothing", b.State())
	}
	c.Add(time.Second)
	if b.State() != HalfOpen || !b.Ready() {
		t.Fatalf("state %s after the open time; want half-open and ready", b.State())
	}
	if !b.Admit() {
		t.Fatal("the probe was refused")
	}
	if b.Admit() || b.Ready() {
		t.Fatal("a second call was admitted while the one probe is in flight")
	}
	b.Done(true)
	if b.State() != Closed {
		t.Fatalf("state %s after a probe passed; want closed", b.State())
	}
	want := []State{Open, HalfOpen, Closed}
	if len(changes) != len(want) {
		t.Fatalf("changes %v; want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("changes %v; want %v", changes, want)
		}
	}
}

func TestAFailedProbeDoublesTheOpenTime(t *testing.T) {
	c := &clock{now: time.Unix(1e9, 0)}
	b := New(Config{Failures: 1, OpenFor: time.Second, MaxOpenFor: 3 * time.Second, Now: c.Now})
	call(t, b, false)
	for i, open := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second} {
		c.Add(open - time.Millisecond)
		if b.State() != Open {
			t.Fatalf("round %d: state %s before the open time of %s ran out", i, b.State(), open)
		}
		c.Add(time.Millisecond)
		call(t, b, false) // the probe fails
	}
	c.Add(3 * time.Second)
	call(t, b, true)
	call(t, b, false) // closed again: one failure of Failures=1 opens it for OpenFor, not the doubled time
	c.Add(time.Second)
	if b.State() != HalfOpen {
		t.Fatalf("state %s: the open time did not start again from OpenFor", b.State())
	}
}

func TestCancelGivesTheProbeBack(t *testing.T) {
	c := &clock{now: time.Unix(1e9, 0)}
	b := New(Config{Failures: 1, OpenFor: time.Second, Now: c.Now})
	call(t, b, false)
	c.Add(time.Second)
	if !b.Admit() {
		t.Fatal("probe refused")
	}
	b.Cancel()
	if !b.Admit() {
		t.Fatal("a cancelled probe was not given back")
	}
}

func TestCallsFromBeforeTheCircuitOpenedChangeNothing(t *testing.T) {
	c := &clock{now: time.Unix(1e9, 0)}
	b := New(Config{Failures: 2, OpenFor: time.Second, Now: c.Now})
	for range 3 {
		if !b.Admit() {
			t.Fatal("closed circuit refused a call")
		}
	}
	b.Done(false)
	b.Done(false) // opens
	b.Done(true)  // admitted before it opened: must not close it
	if b.State() != Open {
		t.Fatalf("state %s; a late success closed an open circuit", b.State())
	}
}
