package flow

import (
	"math"
	"testing"
	"time"
)

// Seen alike by every sender, the rates add up to the limit and the
// buckets to the burst (or one token each when the senders outnumber it).
func TestSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		limit, burst float64
		weights      []float64 // every sender's; the first is the one asking
		rate, cap    float64   // the first sender's
		totalCap     float64   // every sender's buckets together
	}{
		{name: "alone", limit: 100, burst: 10, weights: []float64{busyWeight}, rate: 100, cap: 10, totalCap: 10},
		{name: "four idle", limit: 200, burst: 20, weights: []float64{1, 1, 1, 1}, rate: 50, cap: 5, totalCap: 20},
		{name: "four busy", limit: 200, burst: 20, weights: []float64{64, 64, 64, 64}, rate: 50, cap: 5, totalCap: 20},
		{name: "idle beside a busy one", limit: 130, burst: 12, weights: []float64{1, 64}, rate: 2, cap: 1 + 10.0/65, totalCap: 12},
		{name: "busy beside two idle", limit: 132, burst: 13, weights: []float64{64, 1, 1}, rate: 128, cap: 1 + 10*64.0/66, totalCap: 13},
		{name: "more senders than the burst", limit: 10, burst: 2, weights: []float64{1, 1, 1}, rate: 10.0 / 3, cap: 1, totalCap: 3},
		{name: "not seen by the others yet", limit: 100, burst: 10, weights: []float64{0, 64}, rate: 0, cap: 1, totalCap: 1 + 1 + 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rate, capacity := split(tt.limit, tt.burst, tt.weights[0], tt.weights[1:])
			if math.Abs(rate-tt.rate) > 1e-9 || math.Abs(capacity-tt.cap) > 1e-9 {
				t.Errorf("split = %g/s, %g tokens; want %g/s, %g tokens", rate, capacity, tt.rate, tt.cap)
			}
			var rates, caps float64
			for i := range tt.weights {
				others := append(append([]float64{}, tt.weights[:i]...), tt.weights[i+1:]...)
				r, c := split(tt.limit, tt.burst, tt.weights[i], others)
				rates += r
				caps += c
			}
			if rates > tt.limit+1e-9 {
				t.Errorf("the rates add up to %g, above the limit %g", rates, tt.limit)
			}
			if math.Abs(caps-tt.totalCap) > 1e-9 {
				t.Errorf("the buckets add up to %g tokens, want %g", caps, tt.totalCap)
			}
		})
	}
}

// A sender takes a larger share only once every other sender has had a
// Heartbeat to see the weight it put; a smaller one at once.
func TestUsable(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	settle := 500 * time.Millisecond
	at := func(ago time.Duration) time.Time { return now.Add(-ago) }
	tests := []struct {
		name string
		said []announcement
		want float64
	}{
		{name: "nothing said", want: 0},
		{name: "first weight not settled", said: []announcement{{weight: 1, stored: at(100 * time.Millisecond)}}, want: 0},
		{name: "first weight not stored", said: []announcement{{weight: 1}}, want: 0},
		{name: "settled", said: []announcement{{weight: 1, stored: at(settle)}}, want: 1},
		{name: "raised, not settled", said: []announcement{{weight: 1, stored: at(2 * settle)}, {weight: 64, stored: at(settle / 2)}}, want: 1},
		{name: "raised and settled", said: []announcement{{weight: 1, stored: at(2 * settle)}, {weight: 64, stored: at(settle)}}, want: 64},
		{name: "raise failed", said: []announcement{{weight: 1, stored: at(2 * settle)}, {weight: 64}}, want: 1},
		{name: "lowered, not settled", said: []announcement{{weight: 64, stored: at(2 * settle)}, {weight: 1, stored: at(10 * time.Millisecond)}}, want: 1},
		{name: "lowered, then raised", said: []announcement{
			{weight: 64, stored: at(3 * settle)}, {weight: 1, stored: at(settle / 2)}, {weight: 64, stored: at(settle / 4)},
		}, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := usable(tt.said, now, settle); got != tt.want {
				t.Errorf("usable = %g, want %g", got, tt.want)
			}
		})
	}
}
