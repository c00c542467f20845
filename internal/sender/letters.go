package sender

import (
	"context"
	"sync"
	"time"

	"github.com/sendonce/sendonce/internal/backoff"
	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/wire"
)

// maxQueuedLetters bounds the dead letters a sender holds in memory while
// the dead-letter stream refuses them (away, or full: it discards new
// letters at its bound): a few hundred bytes each, tens of megabytes at
// most.
const maxQueuedLetters = 100_000

// letterQueue holds the dead letters of rows whose dead or unknown status
// is written, in order: the status writer never waits for the dead-letter
// stream. Past maxQueuedLetters a new letter is left to the reconciler
// (its row shows no stored letter, letter_seq NULL, and the reconciler
// publishes such letters), and counted.
type letterQueue struct {
	mu      sync.Mutex
	pending []deadletter.Letter
	closed  bool
	wake    chan struct{}
	max     int
	// deferred counts the letters left to the reconciler.
	deferred int
}

func newLetterQueue() *letterQueue {
	return &letterQueue{wake: make(chan struct{}, 1), max: maxQueuedLetters}
}

// push queues l; it reports false when the queue is full and l was left to
// the reconciler.
func (q *letterQueue) push(l deadletter.Letter) bool {
	q.mu.Lock()
	full := len(q.pending) >= q.max
	if full {
		q.deferred++
	} else {
		q.pending = append(q.pending, l)
	}
	q.mu.Unlock()
	signal(q.wake)
	return !full
}

func (q *letterQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	signal(q.wake)
}

// take returns the letters waiting, or waits for some; done is true once
// the queue is closed and empty.
func (q *letterQueue) take() (ls []deadletter.Letter, done bool) {
	for {
		q.mu.Lock()
		ls, q.pending = q.pending, nil
		closed := q.closed
		q.mu.Unlock()
		if len(ls) > 0 || closed {
			return ls, len(ls) == 0
		}
		<-q.wake
	}
}

// requeue puts back letters that could not be published.
func (q *letterQueue) requeue(ls []deadletter.Letter) {
	q.mu.Lock()
	q.pending = append(ls, q.pending...)
	q.mu.Unlock()
}

func (q *letterQueue) left() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// publishLetters publishes the queued dead letters and records each in its
// row, until the queue is closed and empty or hold ends. A letter the
// process dies before publishing is published by the reconciler, which
// finds its row dead or unknown with no letter recorded.
func (s *Sender) publishLetters(hold context.Context) {
	for {
		ls, done := s.letters.take()
		if done {
			return
		}
		stored := make([]outbox.Lettered, 0, len(ls))
		for i, l := range ls {
			l.Payload = wire.AppendEncode(nil, wire.Send{ID: l.OutboxID, Gen: l.Gen})
			seq, ok := s.publishLetter(hold, l)
			if !ok {
				s.letters.requeue(ls[i:])
				s.markLettered(stored)
				return
			}
			stored = append(stored, outbox.Lettered{ID: l.OutboxID, Gen: l.Gen, Seq: seq})
		}
		s.markLettered(stored)
	}
}

// markLettered records stored letters in their rows. It is tried once: a
// row left unmarked gets its letter published again by the reconciler,
// which JetStream deduplicates within its window.
func (s *Sender) markLettered(ls []outbox.Lettered) {
	if len(ls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DBTimeout)
	defer cancel()
	if err := outbox.MarkLettered(ctx, s.cfg.Pool, ls); err != nil {
		s.log.Warn("dead letters stored but not recorded in their rows; the reconciler will record them", "err", err, "rows", len(ls))
	}
}

// publishLetter stores l, trying again until it is stored (true) or hold
// ends (false).
func (s *Sender) publishLetter(hold context.Context, l deadletter.Letter) (uint64, bool) {
	for failures := 0; ; {
		seq, err := s.dlq.Publish(hold, l)
		if err == nil {
			s.metrics.deadLetters.WithLabelValues(l.Reason).Inc()
			return seq, true
		}
		failures++
		s.metrics.dlqRetries.Inc()
		d := min(5*time.Second, 100*time.Millisecond<<min(failures, 6))
		if retrying(failures) {
			s.log.Warn("dead letter not stored; trying again", "err", err, "reason", l.Reason, "failures", failures, "retry_in", d.String())
		}
		if !backoff.Sleep(hold, backoff.Jitter(d)) {
			s.log.Error("dead letter still not stored at the shutdown timeout", "err", err, "reason", l.Reason)
			return 0, false
		}
	}
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
