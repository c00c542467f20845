// Package sender turns sms.send messages into provider calls, exactly once as
// the user sees it.
//
// Per message: claim the row in Postgres (a terminal row is acked and
// skipped; a row another attempt holds is backed off), call the provider with
// Idempotency-Key = row id, classify, publish a dead letter if the message is
// finished without being sent, write the status (batched), and only after
// that commit Ack, NakWithDelay or Term. A crash anywhere leaves the message
// unacknowledged and the row claimable again once its lease expires, and the
// next attempt carries the same key.
package sender

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/wire"
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

// Config configures a Sender.
type Config struct {
	// Pool is the database pool; required.
	Pool *pgxpool.Pool
	// JetStream consumes and publishes dead letters; required.
	JetStream jetstream.JetStream
	// Provider sends; required.
	Provider Provider
	// Stream and Consumer name the durable pull consumer; default "SMS"
	// and "senders".
	Stream, Consumer string
	// DeadLetterSubject and DeadLetterStream receive dead letters; default
	// "sms.dlq" and "SMS_DLQ".
	DeadLetterSubject, DeadLetterStream string
	// Concurrency is the most provider calls in flight; default 32.
	Concurrency int
	// ClaimBatch is the most messages claimed in one database round trip;
	// default Concurrency.
	ClaimBatch int
	// WriteBatch is the most status writes committed together; default 256.
	WriteBatch int
	// Lease is how long a claimed row is held for its attempt: a claim that
	// finds a row sending and touched within Lease backs off, one that finds
	// it older takes over. It must exceed the provider timeout plus the
	// status write; default 2*provider timeout + 5s.
	Lease time.Duration
	// RetryBase and RetryCap shape the full-jitter backoff between attempts:
	// U(0, min(RetryCap, RetryBase*2^attempt)). Default 500ms and 60s.
	RetryBase, RetryCap time.Duration
	// MaxNakDelay is the longest retry wait kept in JetStream (a Nak with
	// delay holds one of the consumer's MaxAckPending slots); a longer one
	// (a long Retry-After) acks the message and leaves the row queued with
	// its next_attempt_at for the reconciler to republish. Default 5m.
	MaxNakDelay time.Duration
	// DBTimeout bounds each database round trip; default 10s.
	DBTimeout time.Duration
	// PublishTimeout bounds a dead letter's publication; default 10s.
	PublishTimeout time.Duration
	// Name identifies this sender in the attempts log; default the host name.
	Name string
	// Logger receives the sender's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the sender's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		c.Name, _ = os.Hostname()
	}
	c.Stream = cmp.Or(c.Stream, "SMS")
	c.Consumer = cmp.Or(c.Consumer, "senders")
	c.DeadLetterSubject = cmp.Or(c.DeadLetterSubject, "sms.dlq")
	c.DeadLetterStream = cmp.Or(c.DeadLetterStream, "SMS_DLQ")
	c.Concurrency = cmp.Or(c.Concurrency, 32)
	c.ClaimBatch = cmp.Or(c.ClaimBatch, c.Concurrency)
	c.WriteBatch = cmp.Or(c.WriteBatch, 256)
	if c.Provider != nil {
		c.Lease = cmp.Or(c.Lease, 2*c.Provider.Timeout()+5*time.Second)
	}
	c.RetryBase = cmp.Or(c.RetryBase, 500*time.Millisecond)
	c.RetryCap = cmp.Or(c.RetryCap, 60*time.Second)
	c.DBTimeout = cmp.Or(c.DBTimeout, 10*time.Second)
	c.MaxNakDelay = cmp.Or(c.MaxNakDelay, 5*time.Minute)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("sender: Config.Pool is required")
	case c.JetStream == nil:
		return errors.New("sender: Config.JetStream is required")
	case c.Provider == nil:
		return errors.New("sender: Config.Provider is required")
	case c.Concurrency < 1 || c.Concurrency > 10000:
		return fmt.Errorf("sender: Concurrency %d is outside 1..10000", c.Concurrency)
	case c.ClaimBatch < 1:
		return fmt.Errorf("sender: ClaimBatch %d must be at least 1", c.ClaimBatch)
	case c.WriteBatch < 1:
		return fmt.Errorf("sender: WriteBatch %d must be at least 1", c.WriteBatch)
	case c.Lease <= c.Provider.Timeout():
		return fmt.Errorf("sender: Lease %s must exceed the provider timeout %s", c.Lease, c.Provider.Timeout())
	case c.RetryBase <= 0:
		return fmt.Errorf("sender: RetryBase %s must be positive", c.RetryBase)
	case c.RetryCap < c.RetryBase:
		return fmt.Errorf("sender: RetryCap %s is below RetryBase %s", c.RetryCap, c.RetryBase)
	case c.DBTimeout <= 0 || c.PublishTimeout <= 0:
		return errors.New("sender: DBTimeout and PublishTimeout must be positive")
	}
	return nil
}

// Sender consumes sms.send and calls the provider.
type Sender struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	dlq     deadletter.Publisher
	// maxDeliver is the consumer's MaxDeliver: on the last delivery a retry
	// cannot be handed back to JetStream, so the row is finished instead.
	maxDeliver int
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
	}, nil
}

// action is what to tell JetStream once the status write committed.
type action int

const (
	ack action = iota + 1
	nak
	term
)

// result is one finished attempt on its way to the status writer.
type result struct {
	msg       jetstream.Msg
	row       outbox.Result
	action    action
	delay     time.Duration // for nak
	createdAt time.Time
	attempt   *outbox.Attempt // the attempts-log record, if any
	// keep stops the InProgress heartbeats that hold the message from the
	// claim until the status write committed and JetStream was answered.
	keep func()
}

// release stops r's heartbeats.
func (r result) release() {
	if r.keep != nil {
		r.keep()
	}
}

// Run consumes until ctx is done, then stops fetching, finishes the attempts
// in flight and their status writes and acks, and returns nil.
func (s *Sender) Run(ctx context.Context) error {
	cons, err := s.cfg.JetStream.Consumer(ctx, s.cfg.Stream, s.cfg.Consumer)
	if err != nil {
		return fmt.Errorf("sender: look up consumer %s on stream %s: %w", s.cfg.Consumer, s.cfg.Stream, err)
	}
	heartbeat := heartbeatInterval(cons.CachedInfo().Config)
	s.maxDeliver = cons.CachedInfo().Config.MaxDeliver

	it, err := cons.Messages(jetstream.PullMaxMessages(s.cfg.Concurrency + s.cfg.ClaimBatch))
	if err != nil {
		return fmt.Errorf("sender: start consuming: %w", err)
	}
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
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		s.writeLoop(results)
	}()

	var workers sync.WaitGroup
	slots := make(chan struct{}, s.cfg.Concurrency)
	s.claimLoop(ctx, in, slots, results, &workers, heartbeat)

	// Shutdown: stop fetching, give back what was fetched but not started
	// (Drain hands the buffered messages to read, which naks them for
	// another sender), let the attempts in flight finish and their statuses
	// be written.
	it.Drain()
	<-readerDone
	// Handed to the claim loop but never claimed: back for another sender.
	for len(in) > 0 {
		_ = (<-in).Nak()
	}
	workers.Wait()
	close(results)
	<-writerDone
	return nil
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
			s.log.Warn("fetch failed", "err", err)
			if !sleep(ctx, min(5*time.Second, 50*time.Millisecond<<min(failures, 7))) {
				return
			}
			continue
		}
		failures = 0
		select {
		case in <- m:
		case <-ctx.Done():
			// Fetched but never started: hand it back for another sender.
			_ = m.Nak()
			return
		}
	}
}

// claimLoop takes messages as slots free up, claims them in batches and
// starts one worker per claimed row. It returns when ctx is done.
func (s *Sender) claimLoop(ctx context.Context, in <-chan jetstream.Msg, slots chan struct{}, results chan<- result, workers *sync.WaitGroup, heartbeat time.Duration) {
	batch := make([]jetstream.Msg, 0, s.cfg.ClaimBatch)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		select {
		case m := <-in:
			batch = append(batch[:0], m)
		case <-ctx.Done():
			<-slots
			return
		}
		// Take whatever else is already waiting, while slots are free.
	more:
		for len(batch) < s.cfg.ClaimBatch {
			select {
			case slots <- struct{}{}:
			default:
				break more
			}
			select {
			case m := <-in:
				batch = append(batch, m)
			default:
				<-slots
				break more
			}
		}
		s.claimBatch(ctx, batch, slots, results, workers, heartbeat)
	}
}

// claimBatch claims the rows of batch, which holds one slot per message, and
// starts a worker per claimed row; every other message gets its answer here
// and gives its slot back.
func (s *Sender) claimBatch(ctx context.Context, batch []jetstream.Msg, slots chan struct{}, results chan<- result, workers *sync.WaitGroup, heartbeat time.Duration) {
	release := func() { <-slots }
	byID := make(map[uuid.UUID][]jetstream.Msg, len(batch))
	ids := make([]uuid.UUID, 0, len(batch))
	gens := make(map[uuid.UUID]int32, len(batch))
	for _, m := range batch {
		if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
			s.metrics.redeliveries.Inc()
		}
		p, err := wire.Decode(m.Data())
		if err != nil {
			s.rejectInvalid(ctx, m, uuid.Nil, err.Error())
			release()
			continue
		}
		if _, seen := byID[p.ID]; !seen {
			ids = append(ids, p.ID)
		}
		byID[p.ID] = append(byID[p.ID], m)
		gens[p.ID] = p.Gen
	}
	if len(ids) == 0 {
		return
	}
	dbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.DBTimeout)
	claims, err := outbox.ClaimForSend(dbCtx, s.cfg.Pool, ids, s.cfg.Lease)
	cancel()
	if err != nil {
		// Nothing was claimed: let JetStream deliver these again shortly.
		d := jitter(time.Second)
		s.log.Warn("claim failed; messages will be redelivered", "err", err, "messages", len(batch), "retry_in", d)
		for _, id := range ids {
			for _, m := range byID[id] {
				_ = m.NakWithDelay(d)
				release()
			}
		}
		sleep(ctx, d)
		return
	}
	for _, c := range claims {
		msgs := byID[c.ID]
		// A second copy of the same row in one batch (a republication)
		// waits for the first copy's attempt like any concurrent delivery.
		for _, m := range msgs[1:] {
			_ = m.NakWithDelay(s.cfg.Lease)
			release()
		}
		m := msgs[0]
		switch c.Result {
		case outbox.Claimed, outbox.ClaimedStale:
			workers.Add(1)
			go func() {
				defer workers.Done()
				defer release()
				s.attempt(ctx, m, c, heartbeat, results)
			}()
		case outbox.AlreadyTerminal:
			// The guard that makes a redelivery or a late republication
			// harmless: this row is finished, never call again.
			s.metrics.skipped.Inc()
			_ = m.Ack()
			release()
		case outbox.Leased:
			s.metrics.leased.Inc()
			_ = m.NakWithDelay(c.LeaseLeft + jitter(time.Second))
			release()
		case outbox.NotFound:
			s.rejectInvalid(ctx, m, c.ID, "no outbox row with this id")
			release()
		}
	}
}

// attempt makes one provider attempt for a claimed row and hands its result
// to the status writer.
func (s *Sender) attempt(ctx context.Context, m jetstream.Msg, c outbox.Claim, heartbeat time.Duration, results chan<- result) {
	// The row's attributes are formatted only for a line that is written: a
	// logger made With them for every attempt formatted them eagerly, 3-6 us
	// of CPU per message in BenchmarkSenderRun's profile.
	logAt := func(level slog.Level, msg string, args ...any) {
		if s.log.Enabled(ctx, level) {
			s.log.Log(ctx, level, msg, append([]any{"outbox_id", c.ID.String(), "attempt", c.Attempt}, args...)...)
		}
	}
	started := time.Now()
	// The heartbeats run until the status writer has answered JetStream:
	// a slow call, dead letter or status write never lets the ack deadline
	// pass and the message go to another sender.
	res := result{msg: m, createdAt: c.CreatedAt, row: outbox.Result{ID: c.ID, Attempt: c.Attempt, Lease: c.Lease}, keep: keepAlive(m, heartbeat)}
	record := func(outcome string, o provider.Outcome, errText string) {
		res.attempt = &outbox.Attempt{
			OutboxID: c.ID, Number: c.Attempt, StartedAt: started, Latency: o.Latency, Outcome: outcome,
			HTTPStatus: o.HTTPStatus, ProviderCode: o.Code, Error: errText, Sender: s.cfg.Name,
		}
	}
	finish := func(status outbox.State, reason, errText string, code int) {
		// Dead letter first: if the process dies after it, the repeat is a
		// duplicate; the other order would lose it.
		err := s.dlq.Publish(ctx, deadletter.Letter{
			OutboxID: c.ID, Gen: c.Gen, Reason: reason, Error: errText, Attempts: min(c.Attempt, c.MaxAttempts),
			ProviderCode: code, Payload: m.Data(),
		})
		if err != nil {
			logAt(slog.LevelWarn, "dead letter not published; the row stays leased and will be retried", "err", err, "reason", reason)
			res.action, res.delay = nak, s.cfg.Lease
			res.row.Status = "" // no status write
			results <- res
			return
		}
		s.metrics.deadLetters.WithLabelValues(reason).Inc()
		res.row.Status, res.row.Error = status, errText
		res.action = term
		results <- res
	}

	switch {
	case c.Result == outbox.ClaimedStale && !s.cfg.Provider.Idempotent():
		// An earlier attempt died mid-call at a provider that would send
		// again: the outcome is unknowable, and a retry could double-send.
		// This comes first: even with the budget spent, "dead" would invite
		// a replay of a message that may have been delivered.
		s.metrics.outcomes.WithLabelValues("ambiguous").Inc()
		msg := "an earlier attempt ended without an outcome (sender died mid-call)"
		record("ambiguous", provider.Outcome{}, msg)
		finish(outbox.StatusUnknown, wire.ReasonAmbiguous, msg, 0)
		return
	case c.Attempt > c.MaxAttempts && c.Result != outbox.ClaimedStale:
		// A safety net: a retry on the last attempt already finishes the row.
		s.metrics.outcomes.WithLabelValues("max_attempts").Inc()
		msg := fmt.Sprintf("attempts exhausted (%d of %d)", c.MaxAttempts, c.MaxAttempts)
		record("max_attempts", provider.Outcome{}, msg)
		status, reason, msg := failed(c.MaybeAccepted, wire.ReasonMaxAttempts, msg)
		finish(status, reason, msg, 0)
		return
	}
	// A stale claim at an idempotent provider calls again even past the
	// budget: the same key makes the provider replay the dead attempt's
	// outcome, so this learns it without sending twice.

	// The call runs to its own timeout even during shutdown: abandoning it
	// would only leave the outcome unknown.
	out := s.cfg.Provider.Send(context.WithoutCancel(ctx), provider.Message{Key: c.ID.String(), To: c.To, Body: c.Body})
	s.metrics.providerSeconds.Observe(out.Latency.Seconds())
	s.metrics.outcomes.WithLabelValues(out.Kind.String()).Inc()
	logAt(slog.LevelDebug, "provider attempt", "outcome", out.Kind.String(), "http_status", out.HTTPStatus, "provider_code", out.Code, "latency", out.Latency)

	switch out.Kind {
	case provider.Sent:
		crashpoint.Hit(crashpoint.SenderAfterAccept)
		record("sent", out, "")
		res.row.Status, res.row.ProviderRef = outbox.StatusSent, out.Ref
		res.action = ack
		results <- res
	case provider.Retry:
		record("retry", out, out.Error())
		if c.Attempt >= c.MaxAttempts || s.lastDelivery(m) {
			status, reason, msg := failed(c.MaybeAccepted || out.MaybeAccepted, wire.ReasonMaxAttempts,
				fmt.Sprintf("attempts exhausted (%d of %d); last: %s", c.Attempt, c.MaxAttempts, out.Error()))
			logAt(slog.LevelWarn, "attempts exhausted", "max_attempts", c.MaxAttempts, "status", string(status), "http_status", out.HTTPStatus, "provider_code", out.Code)
			finish(status, reason, msg, out.Code)
			return
		}
		d := out.After
		if d == 0 {
			d = Backoff(c.Attempt, s.cfg.RetryBase, s.cfg.RetryCap)
		}
		res.row.Status, res.row.Error, res.row.RetryAt = outbox.StatusQueued, out.Error(), time.Now().Add(d)
		res.row.MaybeAccepted = out.MaybeAccepted
		res.action, res.delay = nak, d
		if d > s.cfg.MaxNakDelay {
			// A long wait would hold a MaxAckPending slot all along: ack,
			// and let the reconciler republish the row once it is due.
			res.action = ack
		}
		results <- res
	case provider.Permanent:
		record("permanent", out, out.Error())
		// A refusal now says nothing of an earlier attempt whose answer
		// was lost (a rotated key, an expired key store).
		status, reason, msg := failed(c.MaybeAccepted, wire.ReasonPermanent, out.Error())
		logAt(slog.LevelInfo, "permanent failure", "status", string(status), "http_status", out.HTTPStatus, "provider_code", out.Code)
		finish(status, reason, msg, out.Code)
	case provider.Ambiguous:
		record("ambiguous", out, out.Error())
		logAt(slog.LevelWarn, "ambiguous outcome at a provider without idempotency; not retried", "http_status", out.HTTPStatus)
		finish(outbox.StatusUnknown, wire.ReasonAmbiguous, out.Error(), out.Code)
	default:
		record("permanent", out, "unclassified provider outcome")
		status, reason, msg := failed(c.MaybeAccepted, wire.ReasonPermanent, "unclassified provider outcome")
		finish(status, reason, msg, 0)
	}
}

// failed returns how a row ends that will not be sent (see outbox.Unsent),
// with msg saying why it is unknown when it is.
func failed(maybeAccepted bool, reason, msg string) (outbox.State, string, string) {
	status, reason := outbox.Unsent(maybeAccepted, reason)
	if status == outbox.StatusUnknown {
		msg += "; an attempt may have reached the provider"
	}
	return status, reason, msg
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

// rejectInvalid dead-letters a message that did not come from the relay and
// terminates it: it can never succeed, and must neither crash nor loop.
func (s *Sender) rejectInvalid(ctx context.Context, m jetstream.Msg, id uuid.UUID, why string) {
	s.metrics.outcomes.WithLabelValues("invalid").Inc()
	payload := m.Data()
	if len(payload) > wire.MaxPayload {
		// The letter must fit the dead-letter stream whatever arrived.
		payload = payload[:wire.MaxPayload]
	}
	l := deadletter.Letter{OutboxID: id, Reason: wire.ReasonInvalid, Error: why, Payload: payload}
	if md, err := m.Metadata(); err == nil {
		l.StreamSeq = md.Sequence.Stream
	}
	if err := s.dlq.Publish(ctx, l); err != nil {
		s.log.Warn("dead letter for an invalid message not published; redelivering later", "err", err)
		_ = m.NakWithDelay(jitter(5 * time.Second))
		return
	}
	s.metrics.deadLetters.WithLabelValues(wire.ReasonInvalid).Inc()
	s.log.Warn("invalid message dead-lettered", "reason", why, "outbox_id", id.String())
	_ = m.Term()
}

// writeLoop commits status writes in batches and only then answers
// JetStream, until results is closed and drained.
func (s *Sender) writeLoop(results <-chan result) {
	batch := make([]result, 0, s.cfg.WriteBatch)
	rows := make([]outbox.Result, 0, s.cfg.WriteBatch)
	attempts := make([]outbox.Attempt, 0, s.cfg.WriteBatch)
	for {
		r, ok := <-results
		if !ok {
			return
		}
		batch = append(batch[:0], r)
	more:
		for len(batch) < s.cfg.WriteBatch {
			select {
			case r, ok := <-results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		rows, attempts = rows[:0], attempts[:0]
		for _, r := range batch {
			if r.row.Status != "" {
				rows = append(rows, r.row)
			}
			if r.attempt != nil {
				attempts = append(attempts, *r.attempt)
			}
		}
		applied, err := s.writeStatuses(rows, attempts)
		if err != nil {
			// Not acked: the row is still leased, and the redelivery after
			// the lease finds the provider's stored answer under the same key.
			s.log.Error("status write failed; messages will be redelivered", "err", err, "rows", len(rows))
			for _, r := range batch {
				r.release()
				_ = r.msg.NakWithDelay(s.cfg.Lease)
			}
			continue
		}
		now := time.Now()
		for _, r := range batch {
			r.release()
			if r.row.Status != "" && r.row.Status != outbox.StatusSent && !applied[r.row.ID] {
				// Another attempt owns the row now (this one's lease
				// expired): its delivery decides; this one stays silent.
				s.metrics.overtaken.Inc()
				continue
			}
			switch r.action {
			case ack:
				_ = r.msg.Ack()
				if r.row.Status == outbox.StatusSent {
					s.metrics.commitToSent.Observe(now.Sub(r.createdAt).Seconds())
				}
			case nak:
				_ = r.msg.NakWithDelay(r.delay)
			case term:
				_ = r.msg.Term()
			}
		}
	}
}

// writeStatuses commits rows and attempts and returns the ids whose write
// applied. A retry after an error whose commit in fact went through finds
// its writes fenced off (the rows moved on) and reports them not applied:
// the messages then wait for their redelivery instead of a second answer.
func (s *Sender) writeStatuses(rows []outbox.Result, attempts []outbox.Attempt) (map[uuid.UUID]bool, error) {
	if len(rows) == 0 && len(attempts) == 0 {
		return nil, nil
	}
	var err error
	for try := 1; try <= 3; try++ {
		var applied map[uuid.UUID]bool
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DBTimeout)
		err = func() error {
			tx, err := s.cfg.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
			if applied, err = outbox.ApplyResults(ctx, tx, rows, attempts); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}()
		cancel()
		if err == nil {
			return applied, nil
		}
		time.Sleep(jitter(time.Duration(try) * 200 * time.Millisecond))
	}
	return nil, fmt.Errorf("write %d statuses: %w", len(rows), err)
}

// keepAlive tells JetStream the message is still being worked on every
// interval, so a slow provider call or status write does not outlive the ack
// deadline and get the message redelivered to another sender. It returns the
// function that stops it.
func keepAlive(m jetstream.Msg, interval time.Duration) (stop func()) {
	// A timer, not a goroutine: most messages are answered long before the
	// first beat, and stopping costs the status writer no handoff. The
	// lock orders a beat before a stop, so none follows the answer.
	var (
		mu      sync.Mutex
		t       *time.Timer
		stopped bool
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(interval, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		_ = m.InProgress()
		t.Reset(interval)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// heartbeatInterval returns a third of the consumer's effective ack
// deadline: with BackOff set, the server uses BackOff[0] instead of AckWait.
func heartbeatInterval(cfg jetstream.ConsumerConfig) time.Duration {
	wait := cfg.AckWait
	if len(cfg.BackOff) > 0 {
		wait = cfg.BackOff[0]
	}
	if wait <= 0 {
		wait = 30 * time.Second
	}
	return max(wait/3, 100*time.Millisecond)
}

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
