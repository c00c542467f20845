// Package relay moves committed outbox rows into JetStream.
//
// One batch is one transaction: claim pending rows with FOR UPDATE SKIP
// LOCKED, publish each asynchronously with Nats-Msg-Id = its publication id,
// wait for the PubAcks, mark the acknowledged rows queued, commit. A crash at
// any point rolls the rows back to pending, and their republication is
// deduplicated by JetStream (inside the stream's Duplicates window) or made
// harmless by the senders' claim (after it). Several relays share the work
// through SKIP LOCKED, and so do the workers (concurrent batch loops) of one
// relay.
package relay

import (
	"cmp"
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sendonce/sendonce/internal/backoff"
	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/telemetry"
	"github.com/sendonce/sendonce/internal/tracing"
	"github.com/sendonce/sendonce/internal/wire"
)

// Channel is the LISTEN/NOTIFY channel the outbox insert trigger notifies.
const Channel = "sms_outbox"

// Defaults of Config, also the defaults of the relay command's settings.
const (
	DefaultBatchSize     = 500
	DefaultWorkers       = 2
	DefaultPublishWindow = 1024
	DefaultPollInterval  = time.Second
	DefaultAckTimeout    = 10 * time.Second
	DefaultLinger        = 20 * time.Millisecond
	DefaultPollAlone     = 200 * time.Millisecond
	DefaultListenProbe   = 5 * time.Second
	DefaultTimeInterval  = 250 * time.Millisecond
)

// probeChannel carries the relay's own notification that checks that its
// LISTEN hears anything: through a transaction pooler a LISTEN succeeds
// and hears nothing.
const probeChannel = "sendonce_listen_probe"

// Config configures a Relay.
type Config struct {
	// Pool is the database pool; required.
	Pool *pgxpool.Pool
	// JetStream publishes; required.
	JetStream jetstream.JetStream
	// Stream the subject belongs to; publications expect it. Default
	// streams.Stream.
	Stream string
	// BatchSize is the most rows claimed per transaction; default 500.
	BatchSize int
	// Workers is how many batches run at once, each in its own transaction
	// (SKIP LOCKED keeps their rows apart). One batch spends most of its time
	// waiting on Postgres or on PubAcks, so a second keeps the machine busy
	// while the first waits. Default 2.
	Workers int
	// PublishWindow is the most publications awaiting their PubAck at once;
	// default 1024.
	PublishWindow int
	// PollInterval is how often the relay looks for rows without a
	// notification while its LISTEN works: the fallback when a NOTIFY is
	// lost; default 1s.
	PollInterval time.Duration
	// PollAlone is how often the relay looks for rows while no LISTEN
	// wakes it (NoListen, a LISTEN that hears nothing, or one whose
	// connection is lost); default 200ms: a row waits about half of it.
	PollAlone time.Duration
	// Listen is the connection the LISTEN is held on, a session of its own
	// (DATABASE_DIRECT_URL); nil: a connection like the pool's.
	Listen *pgx.ConnConfig
	// NoListen: the relay holds no LISTEN (it has no session of its own:
	// DATABASE_URL goes through a transaction pooler, and no
	// DATABASE_DIRECT_URL is set) and polls every PollAlone.
	NoListen bool
	// ListenProbe is how long a new LISTEN waits to hear the relay's own
	// notification, sent through the pool: one that hears nothing (through
	// a transaction pooler, LISTEN succeeds and hears nothing) is given up,
	// said once, and the relay polls every PollAlone; default 5s.
	ListenProbe time.Duration
	// Linger is how long the relay lets notifications gather before the
	// batch they start: every insert transaction notifies, and a batch
	// per notification is a batch of one or two rows at a moderate rate,
	// each paying whole statements and a commit. A backlog (a full batch)
	// does not wait. Default 20ms; negative starts a batch at each
	// notification.
	Linger time.Duration
	// AckTimeout bounds the wait for a batch's PubAcks; rows not acknowledged
	// by then stay pending and are published again. Default 10s.
	AckTimeout time.Duration
	// DBTimeout bounds each database round trip; default 10s.
	DBTimeout time.Duration
	// TimeInterval is how often the relay makes due scheduled rows
	// (send_at) pending and ends rows past their expiry (expires_at) that
	// no sender holds: a scheduled message is published at most about
	// this long after its send time. Default 250ms.
	TimeInterval time.Duration
	// Logger receives the relay's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Tracing makes a span for the publication of each row that carries a
	// traceparent, and sends the span's in the message's headers; nil
	// traces nothing.
	Tracing *tracing.Tracing
}

func (c *Config) setDefaults() {
	c.Stream = cmp.Or(c.Stream, streams.Stream)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.PublishWindow = cmp.Or(c.PublishWindow, DefaultPublishWindow)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.PollAlone = cmp.Or(c.PollAlone, DefaultPollAlone)
	c.ListenProbe = cmp.Or(c.ListenProbe, DefaultListenProbe)
	c.Linger = cmp.Or(c.Linger, DefaultLinger)
	c.AckTimeout = cmp.Or(c.AckTimeout, DefaultAckTimeout)
	c.DBTimeout = cmp.Or(c.DBTimeout, outbox.DefaultDBTimeout)
	c.TimeInterval = cmp.Or(c.TimeInterval, DefaultTimeInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("relay: Config.Pool is required")
	case c.JetStream == nil:
		return errors.New("relay: Config.JetStream is required")
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("relay: BatchSize %d is outside 1..10000", c.BatchSize)
	case c.Workers < 1 || c.Workers > 64:
		return fmt.Errorf("relay: Workers %d is outside 1..64", c.Workers)
	case c.PublishWindow < 1:
		return fmt.Errorf("relay: PublishWindow %d must be at least 1", c.PublishWindow)
	case c.PollInterval < 10*time.Millisecond || c.PollAlone < 10*time.Millisecond:
		return fmt.Errorf("relay: PollInterval %s and PollAlone %s must be at least 10ms", c.PollInterval, c.PollAlone)
	case c.ListenProbe < 0:
		return fmt.Errorf("relay: ListenProbe %s must not be negative", c.ListenProbe)
	case c.Linger > time.Second:
		return fmt.Errorf("relay: Linger %s is above 1s", c.Linger)
	case c.AckTimeout <= 0:
		return fmt.Errorf("relay: AckTimeout %s must be positive", c.AckTimeout)
	case c.DBTimeout <= 0:
		return fmt.Errorf("relay: DBTimeout %s must be positive", c.DBTimeout)
	case c.TimeInterval < 10*time.Millisecond || c.TimeInterval > time.Minute:
		return fmt.Errorf("relay: TimeInterval %s is outside 10ms..1m", c.TimeInterval)
	}
	return nil
}

// batchBound is the longest one batch may take: claim, wait for the
// PubAcks, mark.
func (c *Config) batchBound() time.Duration {
	return c.DBTimeout + c.AckTimeout + c.DBTimeout
}

// RepublishHorizon is the longest time between two publications of one row
// under the same Nats-Msg-Id while Postgres answers: a failed batch rolls
// its rows back to pending after at most its bound, and the next batch
// comes after at most the longest backoff (5s). The SMS stream's Duplicates
// window must exceed it, by as much Postgres outage as JetStream should
// deduplicate (past the window a republication is stopped by the senders'
// claim instead: harmless, one more delivery).
func (c Config) RepublishHorizon() time.Duration {
	c.setDefaults()
	return c.batchBound() + 5*time.Second
}

// CheckDuplicateWindow returns an error when the stream's Duplicates window
// is shorter than RepublishHorizon.
func (r *Relay) CheckDuplicateWindow(ctx context.Context) error {
	s, err := r.cfg.JetStream.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return fmt.Errorf("relay: stream %s: %w", r.cfg.Stream, err)
	}
	if w, h := s.CachedInfo().Config.Duplicates, r.cfg.RepublishHorizon(); w < h {
		return fmt.Errorf("relay: stream %s deduplicates for %s, less than a failed batch's republication may take (%s: 2 x DB_TIMEOUT + RELAY_ACK_TIMEOUT + 5s); raise duplicate_window or lower the timeouts", r.cfg.Stream, w, h)
	}
	return nil
}

// Relay publishes pending outbox rows to JetStream.
type Relay struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	// batches records every batch's outcome (an idle relay's empty batches
	// too), for Ready.
	batches telemetry.Activity

	// afterAcks runs after a batch's PubAcks and before the queued write; a
	// test hook that simulates a crash there by returning an error.
	afterAcks func() error
}

// New returns a Relay, or an error naming the invalid setting.
func New(cfg Config) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.batchBound())
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, log: cfg.Logger.With("component", "relay"), metrics: m}, nil
}

// Run relays until ctx is done, then finishes the batches in hand and returns
// nil. Transient database and NATS errors are logged and retried with
// backoff; they never end Run.
func (r *Relay) Run(ctx context.Context) error {
	// One wake-up token and one poll tick each start one idle worker: at a
	// trickle of inserts one batch serves them, and a backlog draws the others
	// in as each full batch passes the token on.
	wake := make(chan struct{}, 1)
	// Until a LISTEN is known to hear notifications, the relay polls as
	// often as it would with none.
	poll := time.NewTicker(r.cfg.PollAlone)
	defer poll.Stop()
	var wg sync.WaitGroup
	if r.cfg.NoListen {
		r.log.InfoContext(ctx, "no LISTEN: the relay has no database session of its own (DATABASE_URL goes through a transaction pooler; set DATABASE_DIRECT_URL for one); polling instead",
			"poll_interval", r.cfg.PollAlone.String())
		r.metrics.listening.Set(0)
	} else {
		wg.Go(func() { r.listen(ctx, wake, poll) })
	}
	for range r.cfg.Workers {
		wg.Go(func() { r.work(ctx, wake, poll.C) })
	}
	wg.Go(func() { r.keepTime(ctx, wake) })
	wg.Wait()
	return nil
}

// keepTime makes due scheduled rows pending, and wakes a batch for them,
// and ends the rows that reached their expiry unclaimed, every
// TimeInterval until ctx is done. A pass that moved a full batch goes on at
// once. Errors are logged and the next tick tries again.
func (r *Relay) keepTime(ctx context.Context, wake chan<- struct{}) {
	t := time.NewTicker(r.cfg.TimeInterval)
	defer t.Stop()
	failing := false
	for {
		due, full, err := r.TimePass(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				r.log.WarnContext(ctx, "scheduled and expiring rows: pass failed; trying again every tick", "err", err)
			}
			failing = true
		case err == nil && failing:
			failing = false
			r.log.InfoContext(ctx, "scheduled and expiring rows: passes work again")
		}
		if due > 0 {
			// Promoted rows notify no one: a batch publishes them now.
			signal(wake)
		}
		if full && ctx.Err() == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// TimePass makes one pass of keepTime: it returns how many scheduled rows
// it made pending, and whether either step moved a full batch (more may be
// due).
func (r *Relay) TimePass(ctx context.Context) (int64, bool, error) {
	dbCtx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	defer cancel()
	due, expiredScheduled, err := outbox.PromoteDue(dbCtx, r.cfg.Pool, r.cfg.BatchSize)
	if err != nil {
		return 0, false, err
	}
	r.metrics.timed.WithLabelValues("due").Add(float64(due))
	expired, err := outbox.ExpireDue(dbCtx, r.cfg.Pool, r.cfg.BatchSize)
	if err != nil {
		return due, false, err
	}
	r.metrics.timed.WithLabelValues("expired").Add(float64(expired + expiredScheduled))
	return due, due+expiredScheduled >= int64(r.cfg.BatchSize) || expired >= int64(r.cfg.BatchSize), nil
}

// work runs batches until ctx is done. A full batch means more rows are
// waiting: it goes straight on, and wakes another worker to help.
func (r *Relay) work(ctx context.Context, wake chan struct{}, poll <-chan time.Time) {
	failures := 0
	for {
		if ctx.Err() != nil {
			return
		}
		// The batch runs to completion on shutdown: its own timeouts bound it.
		n, err := r.RelayBatch(context.WithoutCancel(ctx))
		if err != nil {
			r.batches.Fail()
			r.metrics.batchErrors.Inc()
			failures++
			d := backoff.Full(failures, 100*time.Millisecond, 5*time.Second)
			r.log.WarnContext(ctx, "relay batch failed", "err", err, "retry_in", d)
			if !backoff.Sleep(ctx, d) {
				return
			}
			continue
		}
		r.batches.OK()
		failures = 0
		if n == r.cfg.BatchSize {
			signal(wake)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-poll:
		}
	}
}

// RelayBatch relays one batch and returns how many rows it marked queued.
func (r *Relay) RelayBatch(ctx context.Context) (int, error) {
	start := time.Now()
	dbCtx, cancel := context.WithTimeout(ctx, r.cfg.batchBound())
	defer cancel()
	tx, err := r.cfg.Pool.Begin(dbCtx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit

	claimCtx, cancelClaim := context.WithTimeout(dbCtx, r.cfg.DBTimeout)
	rows, err := outbox.ClaimPending(claimCtx, tx, r.cfg.BatchSize)
	cancelClaim()
	if err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, tx.Commit(dbCtx)
	}

	acked, seqs, pubErr := r.publish(ctx, rows)
	crashpoint.Hit(crashpoint.RelayAfterPubAck)
	if r.afterAcks != nil {
		if err := r.afterAcks(); err != nil {
			return 0, err
		}
	}
	markCtx, cancelMark := context.WithTimeout(dbCtx, r.cfg.DBTimeout)
	defer cancelMark()
	n, err := outbox.MarkQueued(markCtx, tx, acked, seqs)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(markCtx); err != nil {
		return 0, fmt.Errorf("commit queued rows: %w", err)
	}
	r.metrics.observeBatch(len(rows), int(n), time.Since(start))
	if pubErr != nil {
		return int(n), fmt.Errorf("publish: %d of %d rows not acknowledged: %w", len(rows)-len(acked), len(rows), pubErr)
	}
	return int(n), nil
}

// publish publishes rows with at most PublishWindow awaiting their PubAck
// and returns the ids JetStream acknowledged (a duplicate counts: the message
// is in the stream) with their stream sequences, and the first error.
func (r *Relay) publish(ctx context.Context, rows []outbox.Pending) ([]uuid.UUID, []int64, error) {
	futures := make([]jetstream.PubAckFuture, len(rows))
	// A traced row's publication span, ended at its PubAck.
	var spans []trace.Span
	if r.cfg.Tracing != nil {
		spans = make([]trace.Span, len(rows))
		defer func() {
			for _, sp := range spans {
				if sp != nil {
					sp.SetStatus(codes.Error, "no PubAck")
					sp.End()
				}
			}
		}()
	}
	ended := func(i int, err error) {
		if spans == nil || spans[i] == nil {
			return
		}
		if err != nil {
			spans[i].SetStatus(codes.Error, err.Error())
		}
		spans[i].End()
		spans[i] = nil
	}
	acked := make([]uuid.UUID, 0, len(rows))
	seqs := make([]int64, 0, len(rows))
	var firstErr error
	deadline := time.NewTimer(r.cfg.AckTimeout)
	defer deadline.Stop()
	timedOut := false

	await := func(i int) {
		f := futures[i]
		if f == nil || timedOut {
			return
		}
		select {
		case ack := <-f.Ok():
			acked = append(acked, rows[i].ID)
			seqs = append(seqs, int64(ack.Sequence))
			ended(i, nil)
		case err := <-f.Err():
			if firstErr == nil {
				firstErr = err
			}
			ended(i, err)
		case <-deadline.C:
			timedOut = true
			if firstErr == nil {
				firstErr = fmt.Errorf("no PubAck within %s", r.cfg.AckTimeout)
			}
		}
	}

	payload := make([]byte, 0, 64*len(rows))
	next := 0 // the oldest publication not yet awaited
	for i, p := range rows {
		for i-next >= r.cfg.PublishWindow {
			await(next)
			next++
		}
		if timedOut {
			break
		}
		start := len(payload)
		payload = wire.AppendEncode(payload, wire.Send{ID: p.ID, Gen: p.Gen})
		// Each row goes to its priority's lane, which the senders serve
		// most urgent first.
		msg := &nats.Msg{Subject: streams.LaneOf(int(p.Priority)).Subject, Data: payload[start:len(payload):len(payload)]}
		if spans != nil && p.Traceparent != "" {
			spans[i] = publishSpan(r.cfg.Tracing, msg, p.Traceparent, p.MsgID())
		}
		f, err := r.cfg.JetStream.PublishMsgAsync(msg,
			jetstream.WithMsgID(p.MsgID()), jetstream.WithExpectStream(r.cfg.Stream))
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			break
		}
		futures[i] = f
	}
	for ; next < len(rows); next++ {
		await(next)
	}
	r.metrics.published.Add(float64(len(acked)))
	r.metrics.publishErrors.Add(float64(len(rows) - len(acked)))
	return acked, seqs, firstErr
}

// publishSpan starts the span of a row's publication as msg, under the
// Nats-Msg-Id msgID, in the trace its traceparent names, and puts the
// span's own traceparent in msg's headers for the senders; nil when the
// row's value does not parse.
func publishSpan(t *tracing.Tracing, msg *nats.Msg, traceparent, msgID string) trace.Span {
	ctx, ok := tracing.Continue(context.Background(), traceparent)
	if !ok {
		return nil
	}
	ctx, span := t.Tracer().Start(ctx, "send "+msg.Subject, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.MessagingSystem, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(msg.Subject), semconv.MessagingMessageID(msgID)))
	msg.Header = nats.Header{}
	msg.Header.Set(tracing.Header, tracing.Format(ctx))
	return span
}

// silentRetry is how long after a LISTEN that heard nothing the relay
// tries again: a probe may have been slow (a failover's first commits).
const silentRetry = time.Minute

// errSilent is a LISTEN that did not hear the relay's own notification.
var errSilent = errors.New("the LISTEN did not hear the relay's own notification")

// listen holds a LISTEN on its own connection and signals wake at every
// notification. It is only a hint: polling finds every row anyway, every
// PollInterval while the LISTEN works and every PollAlone while it does
// not. A LISTEN that hears nothing (it reaches Postgres through a
// transaction pooler, or its probe was slow) is said so once, and tried
// again every silentRetry.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}, poll *time.Ticker) {
	failures := 0
	silent := false
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake, func() {
			failures = 0
			poll.Reset(r.cfg.PollInterval)
			r.metrics.listening.Set(1)
			if silent {
				silent = false
				r.log.InfoContext(ctx, "LISTEN hears notifications again")
			}
		})
		poll.Reset(r.cfg.PollAlone)
		r.metrics.listening.Set(0)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSilent) {
			if !silent {
				r.log.WarnContext(ctx, "LISTEN hears no notification (a transaction pooler between the relay and Postgres?): polling instead, and trying again now and then; set DATABASE_DIRECT_URL to a direct connection for LISTEN",
					"poll_interval", r.cfg.PollAlone.String(), "probe", r.cfg.ListenProbe.String(), "retry_in", silentRetry.String())
			}
			silent = true
			if !backoff.Sleep(ctx, silentRetry) {
				return
			}
			continue
		}
		failures++
		d := backoff.Full(failures, 100*time.Millisecond, 5*time.Second)
		r.log.WarnContext(ctx, "listen connection lost; polling meanwhile", "err", err, "retry_in", d, "poll_interval", r.cfg.PollAlone.String())
		if !backoff.Sleep(ctx, d) {
			return
		}
	}
}

// listenOnce holds one LISTEN until its connection fails; heard is called
// once the LISTEN has heard the relay's own probe.
func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}, heard func()) error {
	cfg := r.cfg.Listen
	if cfg == nil {
		cfg = r.cfg.Pool.Config().ConnConfig
	}
	connCtx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	conn, err := pgx.ConnectConfig(connCtx, cfg.Copy())
	cancel()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, ch := range []string{probeChannel, Channel} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	signal(wake) // rows may have arrived while not listening
	// Notifications within Linger of the first start one batch.
	var lingering atomic.Bool
	notified := func() {
		if r.cfg.Linger <= 0 {
			signal(wake)
		} else if lingering.CompareAndSwap(false, true) {
			time.AfterFunc(r.cfg.Linger, func() {
				lingering.Store(false)
				signal(wake)
			})
		}
	}
	if err := r.probe(ctx, conn, notified); err != nil {
		return err
	}
	heard()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		if n.Channel == Channel {
			notified()
		}
	}
}

// probe sends a notification of its own through the pool and waits up to
// ListenProbe for conn's LISTEN to hear it; errSilent when it does not.
// Insert notifications heard meanwhile are passed to notified.
func (r *Relay) probe(ctx context.Context, conn *pgx.Conn, notified func()) error {
	var b [8]byte
	_, _ = cryptorand.Read(b[:])
	token := hex.EncodeToString(b[:])
	dbCtx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	_, err := r.cfg.Pool.Exec(dbCtx, `SELECT pg_notify($1, $2)`, probeChannel, token)
	cancel()
	if err != nil {
		return fmt.Errorf("probe the listen: %w", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, r.cfg.ListenProbe)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(waitCtx)
		switch {
		case err != nil && ctx.Err() == nil && waitCtx.Err() != nil:
			return errSilent
		case err != nil:
			return fmt.Errorf("wait for the probe: %w", err)
		case n.Channel == Channel:
			notified()
		case n.Channel == probeChannel && n.Payload == token:
			return nil
		}
	}
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Ready reports whether the relay is doing its work, from its own progress
// only (no call to Postgres or NATS): nil while a batch succeeded within the
// longest a batch may take plus two poll intervals. Batches run every poll
// interval even when there is nothing to publish, so a relay that cannot
// reach the database, whose role lacks a grant, or whose loop is stuck turns
// unready; a short outage (a failover, a leader election) does not.
func (r *Relay) Ready() error {
	return r.batches.Fresh("relay batch", time.Now(), r.cfg.batchBound()+2*r.cfg.PollInterval)
}

// SetAfterAcksForTest installs a hook run between a batch's PubAcks and its
// queued write; an error from it aborts the batch as a crash there would.
// Only tests call it.
func SetAfterAcksForTest(r *Relay, fn func() error) { r.afterAcks = fn }
