package console

import (
	"math"
	"sync"
	"time"
)

// budget bounds the password checks (bcrypt comparisons, tens of
// milliseconds of CPU each) that logins may ask for: a token bucket per
// client address and one for the whole console, both taken from before
// the comparison. The failure throttle (limiter) cannot do it: it
// refuses a (name, address) pair only after that pair failed, so a client
// posting a fresh name each time was never refused, and each cost a full
// comparison.
//
// A client's bucket is kept only while it is below full (a full one is
// the same as none, and the sweep drops it), and one is made only when a
// check is allowed, which the console's bucket bounds: the table holds
// at most the checks of a refill time and a sweep gap at the console's
// rate, whatever the number of addresses.
type budget struct {
	mu          sync.Mutex
	rate, burst float64
	total       bucket
	totalRate   float64
	totalBurst  float64
	clients     map[string]*bucket
	swept       time.Time
}

// bucket is a token bucket's level at a time.
type bucket struct {
	tokens float64
	at     time.Time
	// told is set once a refusal of this bucket was logged, and cleared
	// by the next check it allows: one log line per time it runs dry.
	told bool
}

const budgetSweepGap = time.Minute

func newBudget(rate float64, burst int, totalRate float64, totalBurst int) *budget {
	return &budget{
		rate: rate, burst: float64(burst), totalRate: totalRate, totalBurst: float64(totalBurst),
		total: bucket{tokens: float64(totalBurst)}, clients: map[string]*bucket{},
	}
}

// level is b's tokens at now, refilled at rate up to burst.
func (b *bucket) level(now time.Time, rate, burst float64) float64 {
	if b.at.IsZero() || !now.After(b.at) {
		return min(b.tokens, burst)
	}
	return min(burst, b.tokens+now.Sub(b.at).Seconds()*rate)
}

// until is how long until a bucket at level holds a whole token.
func until(level, rate float64) time.Duration {
	return time.Duration(math.Ceil((1 - level) / rate * float64(time.Second)))
}

// refusal says why take refused a check.
type refusal int

const (
	allowed refusal = iota
	// clientSpent: the client's budget is spent.
	clientSpent
	// totalSpent: the console's budget is spent.
	totalSpent
)

// take spends one password check of client at now. When a budget is
// spent it spends nothing and returns how long until both have a check
// again, which budget refused, and whether that is the first refusal
// since it ran dry (worth a log line).
func (b *budget) take(client string, now time.Time) (wait time.Duration, why refusal, first bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.swept) > budgetSweepGap {
		b.sweep(now)
	}
	c := b.clients[client]
	cl := b.burst
	if c != nil {
		cl = c.level(now, b.rate, b.burst)
	}
	tl := b.total.level(now, b.totalRate, b.totalBurst)
	if cl < 1 {
		wait, why = until(cl, b.rate), clientSpent
	}
	if tl < 1 {
		if w := until(tl, b.totalRate); w > wait {
			wait = w
		}
		if why == allowed {
			why = totalSpent
		}
	}
	switch why {
	case clientSpent:
		first, c.told = !c.told, true
		return wait, why, first
	case totalSpent:
		first, b.total.told = !b.total.told, true
		return wait, why, first
	}
	if c == nil {
		c = &bucket{}
		b.clients[client] = c
	}
	*c = bucket{tokens: cl - 1, at: now}
	b.total = bucket{tokens: tl - 1, at: now}
	return 0, allowed, false
}

// sweep drops the clients whose bucket is full again; b.mu is held.
func (b *budget) sweep(now time.Time) {
	b.swept = now
	for k, c := range b.clients {
		if c.level(now, b.rate, b.burst) >= b.burst {
			delete(b.clients, k)
		}
	}
}

// size returns how many client buckets the budget keeps.
func (b *budget) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.clients)
}
