// Package breaker keeps one provider's circuit: closed while it answers,
// open after consecutive failures, and half-open once the open time has
// passed, when a few probes decide whether it closes again.
//
// A breaker only decides where new work goes. Whether a given message may
// move to another provider is not its question: that depends on what the
// message's own attempts at the first provider may have done.
package breaker

import (
	"cmp"
	"sync"
	"time"
)

// State is a circuit's state.
type State int

// The states, in the order of their gauge values.
const (
	Closed State = iota
	HalfOpen
	Open
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	}
	return "open"
}

// Config configures a Breaker. Zero values take the defaults.
type Config struct {
	// Failures is how many failures in a row open the circuit; default 5.
	Failures int
	// OpenFor is how long the circuit stays open before the first probe;
	// default 10s. Each probe that fails doubles it, up to MaxOpenFor.
	OpenFor time.Duration
	// MaxOpenFor bounds OpenFor's doubling; default 5m.
	MaxOpenFor time.Duration
	// Probes is how many calls may be in flight while half-open, and how
	// many must succeed in a row to close the circuit; default 1.
	Probes int
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// OnChange, when set, is called with the new state after each change,
	// outside the breaker's lock.
	OnChange func(State)
}

// Breaker is one circuit. Its methods are safe for concurrent use.
type Breaker struct {
	cfg Config

	mu        sync.Mutex
	state     State
	failures  int           // in a row, while closed
	openUntil time.Time     // while open
	openFor   time.Duration // the current open time
	inFlight  int           // probes taken, while half-open
	passed    int           // probes that succeeded, while half-open
}

// New returns a closed breaker.
func New(cfg Config) *Breaker {
	cfg.Failures = cmp.Or(cfg.Failures, 5)
	cfg.OpenFor = cmp.Or(cfg.OpenFor, 10*time.Second)
	cfg.MaxOpenFor = max(cmp.Or(cfg.MaxOpenFor, 5*time.Minute), cfg.OpenFor)
	cfg.Probes = cmp.Or(cfg.Probes, 1)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Breaker{cfg: cfg, openFor: cfg.OpenFor}
}

// State returns the circuit's state, turning open into half-open once the
// open time has passed.
func (b *Breaker) State() State {
	b.mu.Lock()
	s, changed := b.tick()
	b.mu.Unlock()
	b.changed(changed, s)
	return s
}

// Ready reports whether a call would be admitted now, without taking a
// probe: where new work should go.
func (b *Breaker) Ready() bool {
	b.mu.Lock()
	s, changed := b.tick()
	ok := s == Closed || (s == HalfOpen && b.inFlight < b.cfg.Probes)
	b.mu.Unlock()
	b.changed(changed, s)
	return ok
}

// Admit asks to make a call. It reports false while the circuit is open,
// or half-open with every probe taken; when it reports true, the caller
// reports the call's result with Done, or Cancel if it made no call.
func (b *Breaker) Admit() bool {
	b.mu.Lock()
	s, changed := b.tick()
	ok := s == Closed
	if s == HalfOpen && b.inFlight < b.cfg.Probes {
		b.inFlight++
		ok = true
	}
	b.mu.Unlock()
	b.changed(changed, s)
	return ok
}

// Cancel gives back an admission for which no call was made.
func (b *Breaker) Cancel() {
	b.mu.Lock()
	if b.state == HalfOpen && b.inFlight > 0 {
		b.inFlight--
	}
	b.mu.Unlock()
}

// Done reports an admitted call's result: ok when the provider answered
// as a working provider does (whatever it said of the message), not ok
// when it could not be reached, refused to take the request, or gave no
// answer.
func (b *Breaker) Done(ok bool) {
	b.mu.Lock()
	var changed bool
	switch b.state {
	case Closed:
		if ok {
			b.failures = 0
		} else if b.failures++; b.failures >= b.cfg.Failures {
			b.open(b.cfg.OpenFor)
			changed = true
		}
	case HalfOpen:
		if b.inFlight > 0 {
			b.inFlight--
		}
		if !ok {
			b.open(min(2*b.openFor, b.cfg.MaxOpenFor))
			changed = true
		} else if b.passed++; b.passed >= b.cfg.Probes {
			b.state, b.failures, b.openFor = Closed, 0, b.cfg.OpenFor
			changed = true
		}
	case Open:
		// A call admitted before the circuit opened: it changes nothing.
	}
	s := b.state
	b.mu.Unlock()
	b.changed(changed, s)
}

func (b *Breaker) open(d time.Duration) {
	b.state, b.openFor, b.openUntil = Open, d, b.cfg.Now().Add(d)
	b.inFlight, b.passed = 0, 0
}

// tick moves an open circuit whose time has passed to half-open; b.mu is
// held.
func (b *Breaker) tick() (State, bool) {
	if b.state == Open && !b.cfg.Now().Before(b.openUntil) {
		b.state, b.inFlight, b.passed = HalfOpen, 0, 0
		return b.state, true
	}
	return b.state, false
}

func (b *Breaker) changed(changed bool, s State) {
	if changed && b.cfg.OnChange != nil {
		b.cfg.OnChange(s)
	}
}
