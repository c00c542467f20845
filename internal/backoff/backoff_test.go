package backoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/backoff"
)

// Full spreads over the whole interval, which doubles to the cap, and is
// never 0 nor past the ceiling.
func TestFullSpreadsToTheCap(t *testing.T) {
	t.Parallel()
	const base, cap = 10 * time.Millisecond, 300 * time.Millisecond
	for n := -1; n < 70; n++ {
		ceiling := cap
		if n >= 0 && n < 5 {
			ceiling = min(cap, base<<n)
		}
		if n < 0 {
			ceiling = base
		}
		var lo, hi time.Duration = time.Hour, 0
		for range 2000 {
			d := backoff.Full(n, base, cap)
			if d < time.Millisecond || d > ceiling+time.Millisecond {
				t.Fatalf("Full(%d) = %s, outside [1ms, %s]", n, d, ceiling+time.Millisecond)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo > ceiling/4+time.Millisecond || hi < ceiling*3/4 {
			t.Errorf("Full(%d) stayed within [%s, %s] of [0, %s]: not the full interval", n, lo, hi, ceiling)
		}
	}
}

func TestJitterStaysInTheUpperHalf(t *testing.T) {
	t.Parallel()
	const d = 100 * time.Millisecond
	var lo, hi time.Duration = d, 0
	for range 2000 {
		j := backoff.Jitter(d)
		if j < d/2 || j > d {
			t.Fatalf("Jitter(%s) = %s, outside [%s, %s]", d, j, d/2, d)
		}
		lo, hi = min(lo, j), max(hi, j)
	}
	if lo > 60*time.Millisecond || hi < 90*time.Millisecond {
		t.Errorf("Jitter(%s) stayed within [%s, %s]", d, lo, hi)
	}
}

// Sleep ends with its context, saying so.
func TestSleepEndsWithItsContext(t *testing.T) {
	t.Parallel()
	if !backoff.Sleep(context.Background(), time.Millisecond) {
		t.Fatal("a sleep that passed reported false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if backoff.Sleep(ctx, time.Hour) {
		t.Fatal("a sleep on an ended context reported true")
	}
}
