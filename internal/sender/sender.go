// Package sender turns sms.send messages into provider calls, exactly once as
// the user sees it.
//
// Per message: claim the row in Postgres under a claim token (a terminal row
// is acked and skipped; a row another claim holds is backed off), call the
// provider with Idempotency-Key = row id, decide from the answer (decide, a
// pure function), write the status (batched), and only after that commit
// Ack, NakWithDelay or Term; a row that ended dead or unknown then gets its
// dead letter. Nothing learned is dropped for an outage: a claim whose answer
// was lost is run again with the same token until it answers, a status write
// is retried until it commits, and a dead letter until it is stored, while
// InProgress heartbeats hold the messages. A crash anywhere leaves the
// message unacknowledged and the row claimable again once its lease runs
// out, and the next attempt carries the same key.
//
// The files: config.go (settings), sender.go (Run: fetch and wire the
// stages), claim.go (the claim loop), attempt.go (one provider call),
// decide.go (outcome -> status, reason, JetStream answer, letter), writer.go
// (batched status writes), letters.go (dead letters), keepalive.go
// (InProgress heartbeats).
package sender

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/provider"
)

// Provider is what the sender needs of a provider client.
type Provider interface {
	// Send makes one attempt and classifies it.
	Send(ctx context.Context, m provider.Message) provider.Outcome
	// Idempotent reports whether the provider honours idempotency keys.
	Idempotent() bool
	// Timeout is the bound on one attempt.
	Timeout() time.Duration
}

// Sender consumes sms.send and calls the provider.
type Sender struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	dlq     deadletter.Publisher
	letters *letterQueue
	// invalid counts the invalid messages whose dead letters are being
	// published.
	invalid sync.WaitGroup
	// maxDeliver is the consumer's MaxDeliver: on the last delivery a retry
	// cannot be handed back to JetStream, so the row is parked instead.
	maxDeliver int
	// heartbeat is the InProgress interval that holds a message.
	heartbeat time.Duration
	health    health // progress for Ready (health.go)
}

// New returns a Sender, or an error naming the invalid setting.
func New(cfg Config) (*Sender, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Sender{
		cfg: cfg, log: cfg.Logger.With("component", "sender"), metrics: m,
		dlq: deadletter.Publisher{
			JetStream: cfg.JetStream, Subject: cfg.DeadLetterSubject, Stream: cfg.DeadLetterStream,
			Timeout: cfg.PublishTimeout,
		},
		letters: newLetterQueue(),
	}, nil
}

// Run consumes until ctx is done, then stops fetching, finishes the claims,
// attempts, status writes, acks and dead letters in hand, and returns nil.
// Work held through an outage is tried until ShutdownTimeout after ctx is
// done; what is still unfinished then is left to redelivery and the
// reconciler, and Run returns an error saying how much.
func (s *Sender) Run(ctx context.Context) error {
	cons, err := s.cfg.JetStream.Consumer(ctx, s.cfg.Stream, s.cfg.Consumer)
	if err != nil {
		return fmt.Errorf("sender: look up consumer %s on stream %s: %w", s.cfg.Consumer, s.cfg.Stream, err)
	}
	s.heartbeat = heartbeatInterval(cons.CachedInfo().Config)
	s.maxDeliver = cons.CachedInfo().Config.MaxDeliver

	it, err := cons.Messages(jetstream.PullMaxMessages(s.cfg.Concurrency + s.cfg.ClaimBatch))
	if err != nil {
		return fmt.Errorf("sender: start consuming: %w", err)
	}
	s.health.started()
	// hold is done ShutdownTimeout after ctx: until then, work in hand is
	// retried through outages.
	hold, cancelHold := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHold()
	stopHoldTimer := context.AfterFunc(ctx, func() { time.AfterFunc(s.cfg.ShutdownTimeout, cancelHold) })
	defer stopHoldTimer()

	// Buffered: while the claim loop waits for the database, the reader
	// keeps moving fetched messages here, and the next claim takes them all
	// in one statement instead of one claim per message.
	in := make(chan jetstream.Msg, s.cfg.ClaimBatch)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		s.read(ctx, it, in)
	}()

	results := make(chan result, s.cfg.Concurrency+s.cfg.WriteBatch)
	var unwritten int
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		unwritten = s.writeLoop(hold, results)
	}()
	lettersDone := make(chan struct{})
	go func() {
		defer close(lettersDone)
		s.publishLetters(hold)
	}()

	var workers sync.WaitGroup
	slots := make(chan struct{}, s.cfg.Concurrency)
	s.claimLoop(ctx, hold, in, slots, results, &workers)

	// Shutdown: stop fetching, give back what was fetched but not started
	// (Drain hands the buffered messages to read, which naks them for
	// another sender), let the attempts in flight finish and their statuses
	// be written and their letters published.
	it.Drain()
	<-readerDone
	// Handed to the claim loop but never claimed: back for another sender.
	for len(in) > 0 {
		_ = (<-in).Nak()
	}
	workers.Wait()
	s.invalid.Wait()
	close(results)
	<-writerDone
	s.letters.close()
	<-lettersDone
	var errs []error
	if unwritten > 0 {
		errs = append(errs, fmt.Errorf("sender: %d outcomes not written within the shutdown timeout %s; their messages will be redelivered", unwritten, s.cfg.ShutdownTimeout))
	}
	if n := s.letters.left(); n > 0 {
		errs = append(errs, fmt.Errorf("sender: %d dead letters not published within the shutdown timeout; the reconciler will publish them", n))
	}
	return errors.Join(errs...)
}

// read moves messages from the iterator to in until the iterator is stopped.
func (s *Sender) read(ctx context.Context, it jetstream.MessagesContext, in chan<- jetstream.Msg) {
	failures := 0
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return
			}
			failures++
			s.health.fetchFailed()
			s.log.Warn("fetch failed", "err", err)
			if !sleep(ctx, min(5*time.Second, 50*time.Millisecond<<min(failures, 7))) {
				return
			}
			continue
		}
		failures = 0
		s.health.fetched()
		select {
		case in <- m:
		case <-ctx.Done():
			// Fetched but never started: hand it back for another sender.
			_ = m.Nak()
			return
		}
	}
}

// lastDelivery reports whether m is the consumer's last delivery of its
// message: a Nak would not bring it back.
func (s *Sender) lastDelivery(m jetstream.Msg) bool {
	if s.maxDeliver <= 0 {
		return false
	}
	md, err := m.Metadata()
	return err == nil && int(md.NumDelivered) >= s.maxDeliver
}

// backOff answers a delivery that must wait (another claim holds the row,
// or it is a second copy of a message in hand) with a delayed Nak; on its
// last delivery it acks instead: the row's own message, or the reconciler,
// moves it, and the consumer's budget is not the row's.
func (s *Sender) backOff(m jetstream.Msg, d time.Duration) {
	if s.lastDelivery(m) {
		_ = m.Ack()
		return
	}
	_ = m.NakWithDelay(d)
}

// retrying tells whether an operation that keeps failing should be logged
// now: its first failure, then every tenth.
func retrying(failures int) bool { return failures == 1 || failures%10 == 0 }
