package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/tracing"
	"github.com/sendonce/sendonce/internal/wire"
)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Pool and JetStream are required.
	Pool      *pgxpool.Pool
	JetStream jetstream.JetStream
	// Stream names the work stream; default "SMS". A row is republished to
	// its priority's lane (streams.Lanes).
	Stream string
	// Interval between passes; default 30s.
	Interval time.Duration
	// Grace is how long past its retry time a queued row, or past the end
	// of its claim's lease a sending row, waits before it counts as stuck.
	// It must exceed the lane consumers' AckWait; default 2m.
	Grace time.Duration
	// BatchSize is the most rows handled per transaction; default 100.
	BatchSize int
	// LetterGrace is how long a dead or unknown row may wait for the
	// sender that finished it to publish its dead letter before the
	// reconciler publishes it; default 30s.
	LetterGrace time.Duration
	// DBTimeout bounds each database round trip; default 10s.
	DBTimeout time.Duration
	// Logger and Registerer as for the relay.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Tracing continues a traced row's trace through its republication,
	// as the relay's publication does; nil traces nothing.
	Tracing *tracing.Tracing
}

// Reconciler finds rows no message will move any more (the broker lost the
// message, it left the consumer at MaxDeliver, or its sender died and no
// redelivery came) and republishes them under a new publish generation, with
// the same idempotency key, or finalises them when their attempts are spent.
// Several reconcilers may run at once: rows are claimed with SKIP LOCKED.
type Reconciler struct {
	cfg     ReconcilerConfig
	log     *slog.Logger
	dlq     deadletter.Publisher
	actions *prometheus.CounterVec
	letters prometheus.Counter
}

// NewReconciler returns a Reconciler, or an error naming the bad setting.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	cfg.Stream = cmp.Or(cfg.Stream, streams.Stream)
	cfg.Interval = cmp.Or(cfg.Interval, 30*time.Second)
	cfg.Grace = cmp.Or(cfg.Grace, 2*time.Minute)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 100)
	cfg.LetterGrace = cmp.Or(cfg.LetterGrace, 30*time.Second)
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Pool == nil || cfg.JetStream == nil:
		return nil, errors.New("reconciler: Pool and JetStream are required")
	case cfg.Interval < 10*time.Millisecond:
		return nil, fmt.Errorf("reconciler: Interval %s is below 10ms", cfg.Interval)
	case cfg.Grace <= 0:
		return nil, fmt.Errorf("reconciler: Grace %s must be positive", cfg.Grace)
	case cfg.BatchSize < 1:
		return nil, fmt.Errorf("reconciler: BatchSize %d must be at least 1", cfg.BatchSize)
	}
	r := &Reconciler{
		cfg: cfg,
		log: cfg.Logger.With("component", "reconciler"),
		dlq: deadletter.Publisher{JetStream: cfg.JetStream},
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_reconciler_actions_total",
			Help: "Stuck rows the reconciler handled, by action (republished, dead; unknown, from releases that ended spent rows of open fate unknown rather than republish them for a sender to settle).",
		}, []string{"action"}),
		letters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_reconciler_letters_published_total",
			Help: "Dead letters the reconciler published for rows that ended dead or unknown without one stored.",
		}),
	}
	for _, a := range []string{"republished", "dead", "unknown"} {
		r.actions.WithLabelValues(a) // series exist from the start at 0
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.actions, r.letters} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("reconciler: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// CheckGrace returns an error unless the grace period exceeds every lane
// consumer's ack deadline, so that a stuck row is never one a redelivery
// will still handle.
func (r *Reconciler) CheckGrace(ctx context.Context) error {
	for _, l := range streams.Lanes {
		cons, err := r.cfg.JetStream.Consumer(ctx, r.cfg.Stream, l.Consumer)
		if err != nil {
			return fmt.Errorf("reconciler: look up consumer %s: %w", l.Consumer, err)
		}
		cc := cons.CachedInfo().Config
		wait := cc.AckWait
		if len(cc.BackOff) > 0 {
			wait = max(wait, cc.BackOff[len(cc.BackOff)-1])
		}
		if r.cfg.Grace <= wait {
			return fmt.Errorf("reconciler: grace %s must exceed consumer %s's ack deadline %s", r.cfg.Grace, l.Consumer, wait)
		}
	}
	return nil
}

// Run reconciles every Interval until ctx is done.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for {
			n, err := r.Pass(context.WithoutCancel(ctx))
			if err != nil {
				r.log.WarnContext(ctx, "reconcile pass failed", "err", err)
				break
			}
			if n < r.cfg.BatchSize || ctx.Err() != nil {
				break
			}
		}
	}
}

// Pass handles one batch of stuck rows and returns how many it handled,
// then publishes the dead letters of rows that ended without one stored (it
// finalised them, or a sender died before publishing).
func (r *Reconciler) Pass(ctx context.Context) (int, error) {
	n, letters, err := r.stuckPass(ctx)
	if err != nil {
		return 0, err
	}
	// The rows are final in the database; their letters follow, and a
	// failure here is repaired by the next pass.
	r.publishLetters(ctx, letters)
	if err := r.letterPass(ctx); err != nil {
		return n, err
	}
	return n, nil
}

func (r *Reconciler) stuckPass(ctx context.Context) (int, []deadletter.Letter, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*r.cfg.DBTimeout)
	defer cancel()
	// Each lookup fetches the info it caches: one request each per pass.
	// A row is republished only once its lane's consumer is done with its
	// message (acked, terminated, or out of deliveries: the ack floor is
	// past it). A message still held (a sender's call in flight, whose
	// claim a failover may have lost) or still to be redelivered is left
	// to its holder and to JetStream: republishing it would hand the row to
	// a second sender while the first may still be calling the provider.
	var done [3]uint64
	for i, l := range streams.Lanes {
		cons, err := r.cfg.JetStream.Consumer(ctx, r.cfg.Stream, l.Consumer)
		if err != nil {
			return 0, nil, fmt.Errorf("look up consumer %s: %w", l.Consumer, err)
		}
		done[i] = cons.CachedInfo().AckFloor.Stream
	}
	stream, err := r.cfg.JetStream.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return 0, nil, fmt.Errorf("look up stream: %w", err)
	}
	sinfo := stream.CachedInfo()
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	stuck, err := outbox.ClaimStuck(ctx, tx, r.cfg.Grace, done, sinfo.State.LastSeq, r.cfg.BatchSize)
	if err != nil || len(stuck) == 0 {
		return 0, nil, err
	}
	var letters []deadletter.Letter
	for _, s := range stuck {
		l, err := r.handle(ctx, tx, s)
		if err != nil {
			return 0, nil, fmt.Errorf("row %s: %w", s.ID, err)
		}
		if l != nil {
			letters = append(letters, *l)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, nil, fmt.Errorf("commit: %w", err)
	}
	for _, l := range letters {
		r.log.InfoContext(ctx, "stuck row finalised", "outbox_id", l.OutboxID.String(), "reason", l.Reason)
	}
	return len(stuck), letters, nil
}

// handle republishes a stuck row, or finalises one with no attempt left
// whose every attempt is known to have failed, and returns the dead letter
// to publish once that is committed.
//
// A spent row whose fate is open (its last attempt never reported back, an
// attempt may have reached the provider, or a lookup is pending) is
// republished all the same, not guessed unknown here: the reconciler does
// not know the provider, and a sender does. It asks the provider where it
// can be asked, calls again with the same key where the key is honoured,
// and ends the row unknown only where neither is possible, without calling.
func (r *Reconciler) handle(ctx context.Context, tx pgx.Tx, s outbox.Stuck) (*deadletter.Letter, error) {
	if s.Spent() && s.Status == outbox.StatusQueued && !s.MaybeAccepted && !s.LookupPending {
		// No attempt left, and the last one failed and was recorded:
		// nothing reached the provider.
		const msg = "attempts exhausted; its message was lost"
		if err := outbox.Finalize(ctx, tx, s, outbox.StatusDead, wire.ReasonMaxAttempts, msg); err != nil {
			return nil, err
		}
		r.actions.WithLabelValues(string(outbox.StatusDead)).Inc()
		return &deadletter.Letter{OutboxID: s.ID, Gen: s.Gen, Reason: wire.ReasonMaxAttempts, Error: msg, Attempts: s.Attempts}, nil
	}
	gen := s.Gen + 1
	payload := wire.AppendEncode(nil, wire.Send{ID: s.ID, Gen: gen})
	msg := &nats.Msg{Subject: streams.LaneOf(int(s.Priority)).Subject, Data: payload}
	var span trace.Span
	if r.cfg.Tracing != nil && s.Traceparent != "" {
		span = publishSpan(r.cfg.Tracing, msg, s.Traceparent, outbox.MsgID(s.ID, gen))
	}
	ack, err := r.cfg.JetStream.PublishMsg(ctx, msg, jetstream.WithMsgID(outbox.MsgID(s.ID, gen)), jetstream.WithExpectStream(r.cfg.Stream))
	if span != nil {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	if err != nil {
		return nil, fmt.Errorf("republish: %w", err)
	}
	if err := outbox.MarkRepublished(ctx, tx, s.ID, gen, ack.Sequence); err != nil {
		return nil, err
	}
	r.actions.WithLabelValues("republished").Inc()
	r.log.InfoContext(ctx, "stuck row republished", "outbox_id", s.ID.String(), "status", string(s.Status), "gen", gen)
	return nil, nil
}

// publishLetters stores letters and records them in their rows; what fails
// is left to letterPass.
func (r *Reconciler) publishLetters(ctx context.Context, letters []deadletter.Letter) {
	stored := make([]outbox.Lettered, 0, len(letters))
	for _, l := range letters {
		l.Payload = wire.AppendEncode(nil, wire.Send{ID: l.OutboxID, Gen: l.Gen})
		seq, err := r.dlq.Publish(ctx, l)
		if err != nil {
			r.log.WarnContext(ctx, "dead letter not stored; the next pass tries again", "outbox_id", l.OutboxID.String(), "err", err)
			continue
		}
		stored = append(stored, outbox.Lettered{ID: l.OutboxID, Gen: l.Gen, Seq: seq})
	}
	dbCtx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	defer cancel()
	if err := outbox.MarkLettered(dbCtx, r.cfg.Pool, stored); err != nil {
		r.log.WarnContext(ctx, "dead letters stored but not recorded; the next pass records them", "err", err)
	}
}

// letterPass publishes the dead letters of rows that ended dead or unknown
// more than LetterGrace ago and have none recorded: a sender (or this
// reconciler) died or lost the dead-letter stream between the status write
// and the letter. The letter is made from the row, so its reason is the
// row's, and its id (row, generation) makes a repeat a duplicate.
func (r *Reconciler) letterPass(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*r.cfg.DBTimeout)
	defer cancel()
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	rows, err := outbox.ClaimUnlettered(ctx, tx, r.cfg.LetterGrace, r.cfg.BatchSize)
	if err != nil || len(rows) == 0 {
		return err
	}
	stored := make([]outbox.Lettered, 0, len(rows))
	for _, u := range rows {
		l := deadletter.Letter{
			OutboxID: u.ID, Gen: u.Gen, Reason: u.Reason, Error: u.Error, Attempts: u.Attempts, ProviderCode: u.ProviderCode,
			Payload: wire.AppendEncode(nil, wire.Send{ID: u.ID, Gen: u.Gen}),
		}
		seq, err := r.dlq.Publish(ctx, l)
		if err != nil {
			break // the stream is away: the next pass
		}
		stored = append(stored, outbox.Lettered{ID: u.ID, Gen: u.Gen, Seq: seq})
		r.letters.Inc()
	}
	if err := outbox.MarkLettered(ctx, tx, stored); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if len(stored) > 0 {
		r.log.InfoContext(ctx, "dead letters published for rows that ended without one", "rows", len(stored))
	}
	return nil
}
