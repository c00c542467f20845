package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/outbox"
)

// Defaults of RetentionConfig, also the defaults of the relay command's
// OUTBOX_RETENTION and RETENTION_INTERVAL.
const (
	DefaultRetentionAge      = 7 * 24 * time.Hour
	DefaultRetentionInterval = time.Minute
)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// Pool is required.
	Pool *pgxpool.Pool
	// Age is how long finished rows (and their attempts) are kept after
	// their last change; default 7 days.
	Age time.Duration
	// Interval between purges; default 1m.
	Interval time.Duration
	// BatchSize is the most rows deleted per statement; default 1000. Small
	// batches keep each delete's locks short.
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
	cfg    RetentionConfig
	log    *slog.Logger
	purged prometheus.Counter
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
	case cfg.BatchSize < 1:
		return nil, fmt.Errorf("retention: BatchSize %d must be at least 1", cfg.BatchSize)
	}
	r := &Retention{cfg: cfg, log: cfg.Logger.With("component", "retention"),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_retention_purged_rows_total",
			Help: "Finished outbox rows deleted by retention, with their attempts.",
		})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.purged); err != nil {
			return nil, fmt.Errorf("retention: register metrics: %w", err)
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
			return total, err
		}
		if n < int64(r.cfg.BatchSize) {
			break
		}
		if !sleep(ctx, r.cfg.Pause) {
			break
		}
	}
	if total > 0 {
		r.log.InfoContext(ctx, "purged finished rows", "rows", total, "older_than", r.cfg.Age.String())
	}
	return total, nil
}

// DepthCollector exports the outbox's work in progress as gauges, measured
// at most once per MaxAge whatever the scrape rate.
type DepthCollector struct {
	pool    *pgxpool.Pool
	maxAge  time.Duration
	timeout time.Duration
	log     *slog.Logger

	rows, oldestPending, oldestInFlight, up *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	last   outbox.Depth
	lastOK bool
}

// NewDepthCollector returns a collector over pool; register it with the
// process's registry.
func NewDepthCollector(pool *pgxpool.Pool, log *slog.Logger) *DepthCollector {
	if log == nil {
		log = slog.Default()
	}
	return &DepthCollector{
		pool: pool, maxAge: 5 * time.Second, timeout: 3 * time.Second, log: log,
		rows: prometheus.NewDesc("sendonce_outbox_rows",
			"Unfinished outbox rows by status (pending, queued, sending).", []string{"status"}, nil),
		oldestPending: prometheus.NewDesc("sendonce_outbox_oldest_pending_age_seconds",
			"Age of the oldest pending row: how far the relay lags (0 when none).", nil, nil),
		oldestInFlight: prometheus.NewDesc("sendonce_outbox_oldest_inflight_age_seconds",
			"Time since the least recently touched queued or sending row changed (0 when none).", nil, nil),
		up: prometheus.NewDesc("sendonce_outbox_depth_up",
			"1 if the last outbox depth measurement succeeded.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *DepthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rows
	ch <- c.oldestPending
	ch <- c.oldestInFlight
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *DepthCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > c.maxAge {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		d, err := outbox.Measure(ctx, c.pool)
		cancel()
		c.at, c.lastOK = time.Now(), err == nil
		if err != nil {
			c.log.Warn("measure outbox depth", "err", err)
		} else {
			c.last = d
		}
	}
	up := 0.0
	if c.lastOK {
		up = 1
		for s, n := range c.last.Rows {
			ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, float64(n), string(s))
		}
		ch <- prometheus.MustNewConstMetric(c.oldestPending, prometheus.GaugeValue, c.last.OldestPending.Seconds())
		ch <- prometheus.MustNewConstMetric(c.oldestInFlight, prometheus.GaugeValue, c.last.OldestInFlight.Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}
