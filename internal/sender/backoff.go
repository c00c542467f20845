package sender

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff returns the full-jitter delay before the attempt after attempt
// number attempt (counting from 1): U(0, min(cap, base*2^attempt)).
func Backoff(attempt int, base, cap time.Duration) time.Duration {
	attempt = max(attempt, 0) // a negative shift would panic
	ceiling := cap
	if attempt < 62 {
		if d := base << attempt; d > 0 && d < cap {
			ceiling = d
		}
	}
	return time.Duration(rand.Int64N(int64(ceiling))) + time.Millisecond
}

func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
