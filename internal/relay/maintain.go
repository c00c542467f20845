package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/backoff"
	"github.com/sendonce/sendonce/internal/outbox"
)

// Defaults of RetentionConfig, also the defaults of the relay command's
// OUTBOX_RETENTION and RETENTION_INTERVAL. DefaultRetentionAge is as long
// as the dead-letter stream SMS_DLQ keeps its letters (max_age in
// nats/SMS_DLQ.stream.json), so that every letter can still be traced to
// its row and attempts.
const (
	DefaultRetentionAge      = 7 * 24 * time.Hour
	DefaultRetentionInterval = time.Minute
)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// Pool is required.
	Pool *pgxpool.Pool
	// Age is how long finished rows (sent, dead; never unknown, which wait
	// for a person) and their attempts are kept after their last change;
	// default DefaultRetentionAge, at least outbox.PurgeFloor (an hour).
	Age time.Duration
	// Interval between purges; default 1m.
	Interval time.Duration
	// BatchSize is the most rows deleted per statement, 1 to 10000; default
	// 1000. Small batches keep each delete's locks short.
	BatchSize int
	// Pause between two batches of one purge; default 50ms.
	Pause time.Duration
	// DBTimeout bounds each statement; default 10s.
	DBTimeout time.Duration
	// Logger and Registerer as for the relay.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Retention purges finished rows older than Age, in small batches.
type Retention struct {
	cfg         RetentionConfig
	log         *slog.Logger
	purged      prometheus.Counter
	errors      prometheus.Counter
	lastSuccess prometheus.Gauge
}

// NewRetention returns a Retention, or an error naming the bad setting.
func NewRetention(cfg RetentionConfig) (*Retention, error) {
	cfg.Age = cmp.Or(cfg.Age, DefaultRetentionAge)
	cfg.Interval = cmp.Or(cfg.Interval, DefaultRetentionInterval)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 1000)
	cfg.Pause = cmp.Or(cfg.Pause, 50*time.Millisecond)
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, outbox.DefaultDBTimeout)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("retention: Pool is required")
	case cfg.Age <= 0 || cfg.Interval <= 0 || cfg.Pause < 0:
		return nil, errors.New("retention: Age and Interval must be positive")
	case cfg.Age < outbox.PurgeFloor:
		return nil, fmt.Errorf("retention: Age %s is under %s, the least sendonce_purge keeps finished rows", cfg.Age, outbox.PurgeFloor)
	case cfg.BatchSize < 1 || cfg.BatchSize > 10000:
		return nil, fmt.Errorf("retention: BatchSize %d must be 1 to 10000 (the most sendonce_purge deletes in one call)", cfg.BatchSize)
	}
	r := &Retention{cfg: cfg, log: cfg.Logger.With("component", "retention"),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_retention_purged_rows_total",
			Help: "Finished outbox rows deleted by retention, with their attempts.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_retention_errors_total",
			Help: "Retention purges that failed (the next interval tries again).",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sendonce_retention_last_success_timestamp_seconds",
			Help: "Unix time of the end of the last retention purge that succeeded (0: none yet).",
		}),
	}
	age := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sendonce_retention_age_seconds",
		Help: "How long finished rows are kept after their last change (OUTBOX_RETENTION).",
	})
	age.Set(cfg.Age.Seconds())
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.purged, r.errors, r.lastSuccess, age} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("retention: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run purges every Interval until ctx is done.
func (r *Retention) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.Purge(ctx); err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "retention purge failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Purge deletes every finished row older than Age, one batch at a time, and
// returns how many it deleted.
func (r *Retention) Purge(ctx context.Context) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
		n, err := outbox.Purge(dctx, r.cfg.Pool, r.cfg.Age, r.cfg.BatchSize)
		cancel()
		total += n
		r.purged.Add(float64(n))
		if err != nil {
			if ctx.Err() == nil {
				r.errors.Inc()
			}
			return total, err
		}
		if n < int64(r.cfg.BatchSize) {
			break
		}
		if !backoff.Sleep(ctx, r.cfg.Pause) {
			break
		}
	}
	if ctx.Err() == nil {
		r.lastSuccess.SetToCurrentTime()
	}
	if total > 0 {
		r.log.InfoContext(ctx, "purged finished rows", "rows", total, "older_than", r.cfg.Age.String())
	}
	return total, nil
}
