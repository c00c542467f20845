package sender

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
)

func TestUnaccounted(t *testing.T) {
	t.Parallel()
	md := func(seq uint64, n int) *jetstream.MsgMetadata {
		return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, NumDelivered: uint64(n)}
	}
	d := func(seq uint64, n int) outbox.Delivery { return outbox.Delivery{Seq: seq, Count: n} }
	for _, tc := range []struct {
		name       string
		md         *jetstream.MsgMetadata
		prev, back outbox.Delivery
		want       bool
	}{
		{"no metadata", nil, d(0, 0), d(0, 0), false},
		{"first delivery", md(7, 1), d(0, 0), d(0, 0), false},
		{"previous delivery's claim shown", md(7, 3), d(7, 2), d(0, 0), false},
		{"this delivery's claim, run again", md(7, 3), d(7, 3), d(0, 0), false},
		{"previous delivery handed back", md(7, 3), d(7, 1), d(7, 2), false},
		{"first delivery handed back, no claim", md(7, 2), d(0, 0), d(7, 1), false},
		{"previous claim missing", md(7, 3), d(7, 1), d(0, 0), true},
		{"hand-back of an older delivery", md(7, 4), d(7, 1), d(7, 2), true},
		{"hand-back of another message", md(7, 2), d(0, 0), d(8, 1), true},
		{"claim of another message", md(7, 2), d(6, 1), d(0, 0), true},
	} {
		if got := unaccounted(tc.md, tc.prev, tc.back); got != tc.want {
			t.Errorf("%s: unaccounted = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The dead letters a sender holds while the dead-letter stream refuses them
// are bounded: past the bound a letter is left to the reconciler (its row
// keeps no stored letter) and counted, and the queue keeps its order.
func TestLetterQueueIsBounded(t *testing.T) {
	t.Parallel()
	q := newLetterQueue()
	q.max = 3
	for i := range 5 {
		ok := q.push(deadletter.Letter{Attempts: i})
		if ok != (i < 3) {
			t.Errorf("push %d: %v", i, ok)
		}
	}
	ls, done := q.take()
	if done || len(ls) != 3 || ls[0].Attempts != 0 || ls[2].Attempts != 2 || q.deferred != 2 {
		t.Fatalf("took %+v (done %v), deferred %d; want the first 3 in order, 2 deferred", ls, done, q.deferred)
	}
}
