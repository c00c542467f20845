// Package backoff is how every process waits before trying again: a
// full-jitter delay that doubles to a cap, a jittered fixed wait, and a
// sleep that ends with its context. One place, so that the sender's
// retries, the relay's reconnects, the receiver's writes and the
// migrations' lock retries spread the same way.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Full returns the full-jitter delay after failure number n (counting
// from 0 for the first retry's wait, or from the attempt's number):
// U(0, min(cap, base*2^n)) plus a millisecond, so that it is never 0.
// Spreading the whole interval, not a fraction of it, is what keeps many
// clients that failed together from retrying together.
func Full(n int, base, cap time.Duration) time.Duration {
	n = max(n, 0) // a negative shift would panic
	ceiling := cap
	if n < 62 {
		if d := base << n; d > 0 && d < cap {
			ceiling = d
		}
	}
	return time.Duration(rand.Int64N(int64(ceiling))) + time.Millisecond
}

// Jitter returns a delay in [d/2, d]: a fixed wait spread so that the
// processes that began it together do not end it together.
func Jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// Sleep waits d, or less if ctx ends first; it reports whether the whole
// wait passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
