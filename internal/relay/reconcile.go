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

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/wire"
)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Pool and JetStream are required.
	Pool      *pgxpool.Pool
	JetStream jetstream.JetStream
	// Subject, Stream and Consumer name the work subject, its stream and the
	// senders' consumer; defaults "sms.send", "SMS", "senders".
	Subject, Stream, Consumer string
	// Interval between passes; default 30s.
	Interval time.Duration
	// Grace is how long past its retry time a queued row, or past its last
	// touch a sending row, waits before it counts as stuck. It must exceed
	// the senders' lease plus the consumer's AckWait; default 2m.
	Grace time.Duration
	// BatchSize is the most rows handled per transaction; default 100.
	BatchSize int
	// DBTimeout bounds each database round trip; default 10s.
	DBTimeout time.Duration
	// Logger and Registerer as for the relay.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
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
}

// NewReconciler returns a Reconciler, or an error naming the bad setting.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	cfg.Subject = cmp.Or(cfg.Subject, "sms.send")
	cfg.Stream = cmp.Or(cfg.Stream, "SMS")
	cfg.Consumer = cmp.Or(cfg.Consumer, "senders")
	cfg.Interval = cmp.Or(cfg.Interval, 30*time.Second)
	cfg.Grace = cmp.Or(cfg.Grace, 2*time.Minute)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 100)
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
			Help: "Stuck rows the reconciler handled, by action (republished, dead, unknown).",
		}, []string{"action"}),
	}
	for _, a := range []string{"republished", "dead", "unknown"} {
		r.actions.WithLabelValues(a) // series exist from the start at 0
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.actions); err != nil {
			return nil, fmt.Errorf("reconciler: register metrics: %w", err)
		}
	}
	return r, nil
}

// CheckGrace returns an error unless the grace period exceeds the consumer's
// ack deadline, so that a stuck row is never one a redelivery will still
// handle.
func (r *Reconciler) CheckGrace(ctx context.Context) error {
	cons, err := r.cfg.JetStream.Consumer(ctx, r.cfg.Stream, r.cfg.Consumer)
	if err != nil {
		return fmt.Errorf("reconciler: look up consumer: %w", err)
	}
	cc := cons.CachedInfo().Config
	wait := cc.AckWait
	if len(cc.BackOff) > 0 {
		wait = max(wait, cc.BackOff[len(cc.BackOff)-1])
	}
	if r.cfg.Grace <= wait {
		return fmt.Errorf("reconciler: grace %s must exceed the consumer's ack deadline %s", r.cfg.Grace, wait)
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

// Pass handles one batch of stuck rows and returns how many it handled.
func (r *Reconciler) Pass(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*r.cfg.DBTimeout)
	defer cancel()
	// Each lookup fetches the info it caches: one request each per pass.
	cons, err := r.cfg.JetStream.Consumer(ctx, r.cfg.Stream, r.cfg.Consumer)
	if err != nil {
		return 0, fmt.Errorf("look up consumer: %w", err)
	}
	info := cons.CachedInfo()
	stream, err := r.cfg.JetStream.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("look up stream: %w", err)
	}
	sinfo := stream.CachedInfo()
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	stuck, err := outbox.ClaimStuck(ctx, tx, r.cfg.Grace, info.Delivered.Stream, sinfo.State.LastSeq, r.cfg.BatchSize)
	if err != nil || len(stuck) == 0 {
		return 0, err
	}
	for _, s := range stuck {
		if err := r.handle(ctx, tx, s); err != nil {
			return 0, fmt.Errorf("row %s: %w", s.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return len(stuck), nil
}

func (r *Reconciler) handle(ctx context.Context, tx pgx.Tx, s outbox.Stuck) error {
	payload := wire.AppendEncode(nil, wire.Send{ID: s.ID, Gen: s.Gen})
	if s.Spent() {
		// No attempt left. A queued row's last attempt failed and was
		// recorded; a sending row's last attempt never reported back, so
		// whether it reached the provider is unknown, and so it is for a
		// queued row an earlier attempt of which may have been accepted.
		status, reason := outbox.Unsent(s.MaybeAccepted || s.Status == outbox.StatusSending, wire.ReasonMaxAttempts)
		msg := "attempts exhausted; its message was lost"
		switch {
		case s.Status == outbox.StatusSending:
			msg = "attempts exhausted; the last attempt ended without an outcome"
		case s.MaybeAccepted:
			msg = "attempts exhausted; its message was lost, and an earlier attempt may have reached the provider"
		}
		if err := r.dlq.Publish(ctx, deadletter.Letter{
			OutboxID: s.ID, Gen: s.Gen, Reason: reason, Error: msg, Attempts: s.Attempts, Payload: payload,
		}); err != nil {
			return err
		}
		if err := outbox.Finalize(ctx, tx, s, status, reason, msg); err != nil {
			return err
		}
		r.actions.WithLabelValues(string(status)).Inc()
		r.log.InfoContext(ctx, "stuck row finalised", "outbox_id", s.ID.String(), "status", string(status), "reason", reason)
		return nil
	}
	gen := s.Gen + 1
	payload = wire.AppendEncode(payload[:0], wire.Send{ID: s.ID, Gen: gen})
	ack, err := r.cfg.JetStream.PublishMsg(ctx, &nats.Msg{Subject: r.cfg.Subject, Data: payload},
		jetstream.WithMsgID(outbox.MsgID(s.ID, gen)), jetstream.WithExpectStream(r.cfg.Stream))
	if err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	if err := outbox.MarkRepublished(ctx, tx, s.ID, gen, ack.Sequence); err != nil {
		return err
	}
	r.actions.WithLabelValues("republished").Inc()
	r.log.InfoContext(ctx, "stuck row republished", "outbox_id", s.ID.String(), "status", string(s.Status), "gen", gen)
	return nil
}
