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
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
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
	// CanLookup reports whether the provider can be asked which messages
	// it has for a reference; Lookup asks it.
	CanLookup() bool
	Lookup(ctx context.Context, q provider.LookupQuery) provider.LookupResult
	// LookupByContent reports whether a lookup finds messages by number
	// and text rather than by reference (Twilio): a message it finds may
	// be another row's with the same text to the same number.
	LookupByContent() bool
}

// Flow is what the sender needs of a shared rate limit (flow.Limiter).
type Flow interface {
	// Wait takes a token, waiting for one and for any pause to end.
	Wait(ctx context.Context) error
	// TryTake takes a token if one is there now.
	TryTake() bool
	// Return gives back a token taken for a message that made no request.
	Return()
	// Pause holds every sender's requests for d.
	Pause(ctx context.Context, d time.Duration)
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
	// maxDeliver is each lane consumer's MaxDeliver: on the last delivery a
	// retry cannot be handed back to JetStream, so the row is parked instead.
	maxDeliver map[string]int
	// heartbeat is the InProgress interval that holds a message.
	heartbeat time.Duration
	// horizon is how far back the work stream remembers publications
	// (read by Run where lookups settle lost answers).
	horizon horizon
	// lanes are the priority lanes being consumed (set by Run).
	lanes atomic.Pointer[lanes]
	// calling counts the attempts started and not yet decided: outcomes
	// on their way, which a status write may wait for (WriteLinger).
	calling atomic.Int32
	health  health // progress for Ready (health.go)
	// routes are the providers in order (routes.go): Config.Routes, or
	// Config.Provider alone.
	routes []*route
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
	s := &Sender{
		cfg: cfg, log: cfg.Logger.With("component", "sender"), metrics: m,
		dlq: deadletter.Publisher{
			JetStream: cfg.JetStream, Subject: cfg.DeadLetterSubject, Stream: cfg.DeadLetterStream,
			Timeout: cfg.PublishTimeout,
		},
		letters:    newLetterQueue(),
		maxDeliver: map[string]int{},
	}
	s.initRoutes()
	return s, nil
}

// Run consumes until ctx is done, then stops fetching, finishes the claims,
// attempts, status writes, acks and dead letters in hand, and returns nil.
// Work held through an outage is tried until ShutdownTimeout after ctx is
// done; what is still unfinished then is left to redelivery and the
// reconciler, and Run returns an error saying how much.
func (s *Sender) Run(ctx context.Context) error {
	// Each lane holds up to two claim batches, every message held by
	// heartbeats from its arrival, and fetches one when it has room.
	ls, err := s.newLanes(ctx, s.cfg.ClaimBatch)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: nothing was taken yet
		}
		return err
	}
	// The lanes hold nothing yet (no pull went out): an error here leaves
	// nothing to release.
	if err := s.checkSettle(); err != nil {
		return err
	}
	if s.looksUp() || s.failover() {
		s.horizon = horizon{js: s.cfg.JetStream, stream: s.cfg.Stream}
		hctx, cancel := context.WithTimeout(ctx, s.cfg.DBTimeout)
		err := s.horizon.refresh(hctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sender: read stream %s: %w", s.cfg.Stream, err)
		}
	}
	s.lanes.Store(ls)
	// A reconnect tells the readers to pull again at once: the server may
	// have lost their pulls with the old connection.
	nc := s.cfg.JetStream.Conn()
	status := nc.StatusChanged(nats.CONNECTED)
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		for range status {
			ls.reconnected()
		}
	}()
	defer func() {
		nc.RemoveStatusListener(status)
		<-watching
	}()
	s.health.started()
	// hold is done ShutdownTimeout after ctx: until then, work in hand is
	// retried through outages.
	hold, cancelHold := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHold()
	stopHoldTimer := context.AfterFunc(ctx, func() { time.AfterFunc(s.cfg.ShutdownTimeout, cancelHold) })
	defer stopHoldTimer()

	var readers sync.WaitGroup
	if s.looksUp() || s.failover() {
		readers.Go(func() { s.horizon.run(ctx, s.cfg.DBTimeout) })
	}
	for _, l := range ls.all {
		readers.Go(func() { s.readLane(ctx, ls, l) })
	}
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

	// Attempts run on Concurrency workers that live as long as the loop,
	// not on a goroutine each: an attempt's call through net/http needs a
	// stack several times the size a goroutine starts with, and growing
	// one for every message took about a tenth of a sender's CPU.
	slots := make(chan struct{}, s.cfg.Concurrency)
	work := make(chan func(), s.cfg.Concurrency)
	var workers sync.WaitGroup
	for range s.cfg.Concurrency {
		workers.Go(func() {
			for attempt := range work {
				attempt()
			}
		})
	}
	s.claimLoop(ctx, hold, ls, slots, results, work)
	close(work)

	// Shutdown: stop fetching (the readers hand back what arrives from here
	// on), give back what was fetched but not started, for another sender,
	// let the attempts in flight finish and their statuses be written and
	// their letters published.
	readers.Wait()
	s.handBack(hold, ls.unpicked(), nil)
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

// Waiting is the number of messages fetched and held that wait for a slot
// or a token: the demand this sender reports to the shared rate limit.
func (s *Sender) Waiting() int {
	if ls := s.lanes.Load(); ls != nil {
		return ls.waiting()
	}
	return 0
}

// looksUp reports whether an attempt without an answer is settled by a
// lookup: the provider would send a retry again, and can be asked.
func (s *Sender) looksUp() bool {
	for _, r := range s.routes {
		if r.Provider.CanLookup() && !r.Provider.Idempotent() {
			return true
		}
	}
	return false
}

// checkSettle refuses a lookup settle time that a redelivery cannot leave
// between a dead sender's last call and the lookup of its successor: the
// message comes back one ack deadline after its last heartbeat, and the
// sender may have called until its next one, so the gap is the ack deadline
// less a heartbeat interval (two thirds of it).
func (s *Sender) checkSettle() error {
	if !s.looksUp() || s.heartbeat <= 0 {
		return nil
	}
	if gap := 2 * s.heartbeat; s.cfg.LookupSettle > gap {
		return fmt.Errorf("sender: LookupSettle (SMS_API_LOOKUP_SETTLE) %s exceeds %s, what a redelivery leaves after a dead sender's last call (the consumers' ack wait %s less a heartbeat): raise the consumers' ack_wait or lower the settle time",
			s.cfg.LookupSettle, gap, 3*s.heartbeat)
	}
	return nil
}

// lastDelivery reports whether the delivery of metadata md (nil when it
// could not be read) is the consumer's last delivery of its message: a Nak
// would not bring it back.
func (s *Sender) lastDelivery(md *jetstream.MsgMetadata) bool {
	if md == nil {
		return false
	}
	max := s.maxDeliver[md.Consumer]
	return max > 0 && int(md.NumDelivered) >= max
}

// backOff answers a delivery that must wait (another claim holds the row,
// or it is a second copy of a message in hand) with a delayed Nak; on its
// last delivery it acks instead: the row's own message, or the reconciler,
// moves it, and the consumer's budget is not the row's.
func (s *Sender) backOff(m jetstream.Msg, md *jetstream.MsgMetadata, d time.Duration) {
	if s.lastDelivery(md) {
		_ = m.Ack()
		return
	}
	_ = m.NakWithDelay(d)
}

// retrying tells whether an operation that keeps failing should be logged
// now: its first failure, then every tenth.
func retrying(failures int) bool { return failures == 1 || failures%10 == 0 }
