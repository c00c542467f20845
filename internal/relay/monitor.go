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
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/streams"
)

// MonitorConfig configures a Monitor.
type MonitorConfig struct {
	// Pool is required.
	Pool *pgxpool.Pool
	// JetStream, when set, adds the stream and consumer gauges (SMS and
	// SMS_DLQ sizes, the consumer's pending and ack-pending messages).
	JetStream jetstream.JetStream
	// Interval between two rounds of measurements; default 15s.
	Interval time.Duration
	// Timeout bounds each measurement; default 5s.
	Timeout time.Duration
	// CountCap is the most rows one status count reads; above it the count
	// is the planner's estimate. Default 100,000.
	CountCap int
	// Logger and Registerer as for the relay.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Monitor measures the outbox, the tables' health and the streams in the
// background and exports the last values it measured.
//
// Each measurement is a cheap statement of its own with its own timeout:
// ages read the first entry of a partial index, counts stop at CountCap and
// fall back to an estimate, the table and transaction figures come from
// Postgres's statistics views. A measurement that fails keeps its last
// value, so a lag or stuck-rows alert stays raised during the backlog that
// made the database slow, and sendonce_measure_last_success_timestamp_seconds
// says how old that value is (the rules page when it is over 5 minutes).
// Scrapes only read memory: they never wait on the database.
type Monitor struct {
	cfg      MonitorConfig
	log      *slog.Logger
	measures []*measure
	descs    map[string]*prometheus.Desc
	up, last *prometheus.Desc
}

// measure is one measurement and its last outcome.
type measure struct {
	name string
	run  func(ctx context.Context) ([]sample, error)

	mu      sync.Mutex
	samples []sample  // the last successful values
	lastOK  time.Time // zero: never
	failing bool
}

// sample is one value of a gauge with its label values.
type sample struct {
	metric string
	value  float64
	labels []string
}

var monitorMetrics = []struct {
	name, help string
	labels     []string
}{
	{"sendonce_outbox_oldest_pending_age_seconds", "Age of the oldest pending row: how far the relay lags (0 when none).", nil},
	{"sendonce_outbox_oldest_inflight_age_seconds", "Time since the least recently touched queued or sending row changed (0 when none).", nil},
	{"sendonce_outbox_oldest_urgent_age_seconds", "Age of the oldest urgent row not yet sent (pending, queued or sending; 0 when none): the urgent lane's delay.", nil},
	{"sendonce_outbox_oldest_finished_age_seconds", "Time since the least recently changed row retention may purge (sent, dead) changed (0 when none).", nil},
	{"sendonce_outbox_rows", "Unfinished outbox rows by status (pending, queued, sending); counted up to a cap, estimated above it.", []string{"status"}},
	{"sendonce_outbox_receipts_overdue_rows", "Sent rows whose delivery receipt is overdue (SENDER_RECEIPT_OVERDUE) and that the senders' sweep is still looking up; counted up to a cap.", nil},
	{"sendonce_outbox_oldest_receipt_overdue_age_seconds", "Time since the oldest sent row whose receipt is overdue, and still looked up, was sent (0 when none).", nil},
	{"sendonce_outbox_rows_estimated", "1 when sendonce_outbox_rows for the status is the planner's estimate (the count reached its cap).", []string{"status"}},
	{"sendonce_suppression_list_entries", "Numbers on the suppression list (no provider is called for them), by the source of their entry (inbound, refusal, receipt, operator, import, app); counted up to a cap.", []string{"source"}},
	{"sendonce_suppression_list_estimated", "1 when sendonce_suppression_list_entries reached its cap: the list is larger than the counts say.", nil},
	{"sendonce_table_live_rows", "Live row versions of a sendonce table, from pg_stat_user_tables.", []string{"table"}},
	{"sendonce_table_dead_rows", "Dead row versions of a sendonce table waiting for vacuum, from pg_stat_user_tables.", []string{"table"}},
	{"sendonce_table_last_vacuum_timestamp_seconds", "Unix time of the end of the table's last vacuum, manual or automatic (0: never).", []string{"table"}},
	{"sendonce_postgres_oldest_transaction_age_seconds", "Age of the oldest open transaction of another session in the outbox's database (0 when none).", nil},
	{"sendonce_stream_messages", "Messages stored in a JetStream stream.", []string{"stream"}},
	{"sendonce_stream_bytes", "Bytes stored in a JetStream stream.", []string{"stream"}},
	{"sendonce_stream_max_bytes", "The stream's max_bytes limit (-1: none).", []string{"stream"}},
	{"sendonce_consumer_pending_messages", "Messages of the stream the consumer has not delivered yet.", []string{"stream", "consumer"}},
	{"sendonce_consumer_ack_pending_messages", "Messages delivered and not yet acknowledged (in flight, or waiting out a NakWithDelay).", []string{"stream", "consumer"}},
	{"sendonce_consumer_max_ack_pending", "The consumer's max_ack_pending: deliveries stop when ack-pending reaches it.", []string{"stream", "consumer"}},
}

// NewMonitor returns a Monitor, registered with cfg.Registerer; run it with
// Run.
func NewMonitor(cfg MonitorConfig) (*Monitor, error) {
	cfg.Interval = cmp.Or(cfg.Interval, 15*time.Second)
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Second)
	cfg.CountCap = cmp.Or(cfg.CountCap, 100_000)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("monitor: Pool is required")
	case cfg.Interval <= 0 || cfg.Timeout <= 0:
		return nil, errors.New("monitor: Interval and Timeout must be positive")
	case cfg.CountCap < 1:
		return nil, fmt.Errorf("monitor: CountCap %d must be at least 1", cfg.CountCap)
	}
	m := &Monitor{cfg: cfg, log: cfg.Logger.With("component", "monitor"), descs: map[string]*prometheus.Desc{}}
	for _, d := range monitorMetrics {
		m.descs[d.name] = prometheus.NewDesc(d.name, d.help, d.labels, nil)
	}
	m.up = prometheus.NewDesc("sendonce_measure_up",
		"1 if the measurement's last attempt succeeded (its gauges then hold fresh values), else 0.", []string{"measure"}, nil)
	m.last = prometheus.NewDesc("sendonce_measure_last_success_timestamp_seconds",
		"Unix time of the measurement's last success (0: none yet); its gauges keep the values measured then.", []string{"measure"}, nil)
	pool := cfg.Pool
	age := func(metric string, f func(context.Context, outbox.Querier) (time.Duration, error)) func(context.Context) ([]sample, error) {
		return func(ctx context.Context) ([]sample, error) {
			d, err := f(ctx, pool)
			return []sample{{metric: metric, value: d.Seconds()}}, err
		}
	}
	m.measures = []*measure{
		{name: "oldest_pending", run: age("sendonce_outbox_oldest_pending_age_seconds", outbox.OldestPendingAge)},
		{name: "oldest_inflight", run: age("sendonce_outbox_oldest_inflight_age_seconds", outbox.OldestInFlightAge)},
		{name: "oldest_finished", run: age("sendonce_outbox_oldest_finished_age_seconds", outbox.OldestPurgeableAge)},
		{name: "oldest_urgent", run: age("sendonce_outbox_oldest_urgent_age_seconds", outbox.OldestUrgent)},
		{name: "rows", run: m.rows},
		{name: "receipts_overdue", run: m.receiptsOverdue},
		{name: "tables", run: m.tables},
		{name: "suppressions", run: m.suppressions},
		{name: "transactions", run: age("sendonce_postgres_oldest_transaction_age_seconds", outbox.OldestTransactionAge)},
	}
	if cfg.JetStream != nil {
		m.measures = append(m.measures, &measure{name: "streams", run: m.streams})
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(m); err != nil {
			return nil, fmt.Errorf("monitor: register metrics: %w", err)
		}
	}
	return m, nil
}

// Run measures every Interval until ctx is done.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.Measure(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Measure takes every measurement once, each within Timeout.
func (m *Monitor) Measure(ctx context.Context) {
	for _, ms := range m.measures {
		if ctx.Err() != nil {
			return
		}
		mctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
		samples, err := ms.run(mctx)
		cancel()
		ms.mu.Lock()
		wasFailing := ms.failing
		ms.failing = err != nil
		if err == nil {
			ms.samples, ms.lastOK = samples, time.Now()
		}
		ms.mu.Unlock()
		// A line when a measurement starts or stops failing, not one per
		// round.
		switch {
		case err != nil && !wasFailing && ctx.Err() == nil:
			m.log.Warn("measurement failed; exporting its last values", "measure", ms.name, "err", err)
		case err == nil && wasFailing:
			m.log.Info("measurement recovered", "measure", ms.name)
		}
	}
}

func (m *Monitor) rows(ctx context.Context) ([]sample, error) {
	var out []sample
	for _, s := range []outbox.State{outbox.StatusPending, outbox.StatusQueued, outbox.StatusSending} {
		n, err := outbox.CountUpTo(ctx, m.cfg.Pool, s, m.cfg.CountCap)
		if err != nil {
			return nil, err
		}
		estimated := 0.0
		if n >= int64(m.cfg.CountCap) {
			est, err := outbox.EstimateRows(ctx, m.cfg.Pool, s)
			if err != nil {
				return nil, err
			}
			n, estimated = max(n, est), 1
		}
		out = append(out,
			sample{metric: "sendonce_outbox_rows", value: float64(n), labels: []string{string(s)}},
			sample{metric: "sendonce_outbox_rows_estimated", value: estimated, labels: []string{string(s)}})
	}
	return out, nil
}

// receiptsOverdue measures the backlog of the senders' receipt sweep from
// the index of the rows it marks (empty while every receipt comes), reading
// at most CountCap entries of it.
func (m *Monitor) receiptsOverdue(ctx context.Context) ([]sample, error) {
	n, age, err := outbox.OverdueBacklog(ctx, m.cfg.Pool, m.cfg.CountCap)
	if err != nil {
		return nil, err
	}
	return []sample{
		{metric: "sendonce_outbox_receipts_overdue_rows", value: float64(n)},
		{metric: "sendonce_outbox_oldest_receipt_overdue_age_seconds", value: age.Seconds()},
	}, nil
}

// suppressions counts the suppression list by source, reading at most
// CountCap of its entries.
func (m *Monitor) suppressions(ctx context.Context) ([]sample, error) {
	counts, capped, err := outbox.CountSuppressions(ctx, m.cfg.Pool, m.cfg.CountCap)
	if err != nil {
		return nil, err
	}
	out := make([]sample, 0, len(counts)+1)
	for _, src := range outbox.Sources {
		out = append(out, sample{metric: "sendonce_suppression_list_entries", value: float64(counts[src]), labels: []string{src}})
	}
	estimated := 0.0
	if capped {
		estimated = 1
	}
	return append(out, sample{metric: "sendonce_suppression_list_estimated", value: estimated}), nil
}

func (m *Monitor) tables(ctx context.Context) ([]sample, error) {
	stats, err := outbox.Tables(ctx, m.cfg.Pool)
	if err != nil {
		return nil, err
	}
	var out []sample
	for _, s := range stats {
		vac := 0.0
		if !s.LastVacuum.IsZero() {
			vac = float64(s.LastVacuum.UnixNano()) / 1e9
		}
		out = append(out,
			sample{metric: "sendonce_table_live_rows", value: float64(s.Live), labels: []string{s.Table}},
			sample{metric: "sendonce_table_dead_rows", value: float64(s.Dead), labels: []string{s.Table}},
			sample{metric: "sendonce_table_last_vacuum_timestamp_seconds", value: vac, labels: []string{s.Table}})
	}
	return out, nil
}

func (m *Monitor) streams(ctx context.Context) ([]sample, error) {
	var out []sample
	for _, name := range []string{streams.Stream, streams.DeadLetterStream} {
		s, err := m.cfg.JetStream.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		out = append(out,
			sample{metric: "sendonce_stream_messages", value: float64(info.State.Msgs), labels: []string{name}},
			sample{metric: "sendonce_stream_bytes", value: float64(info.State.Bytes), labels: []string{name}},
			sample{metric: "sendonce_stream_max_bytes", value: float64(info.Config.MaxBytes), labels: []string{name}})
	}
	// Every priority lane's consumer: its backlog is the lane's queue.
	for _, l := range streams.Lanes {
		c, err := m.cfg.JetStream.Consumer(ctx, streams.Stream, l.Consumer)
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", l.Consumer, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", l.Consumer, err)
		}
		labels := []string{streams.Stream, l.Consumer}
		out = append(out,
			sample{metric: "sendonce_consumer_pending_messages", value: float64(info.NumPending), labels: labels},
			sample{metric: "sendonce_consumer_ack_pending_messages", value: float64(info.NumAckPending), labels: labels},
			sample{metric: "sendonce_consumer_max_ack_pending", value: float64(info.Config.MaxAckPending), labels: labels})
	}
	return out, nil
}

// Describe implements prometheus.Collector.
func (m *Monitor) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
	ch <- m.up
	ch <- m.last
}

// Collect implements prometheus.Collector: the last values, never a query.
func (m *Monitor) Collect(ch chan<- prometheus.Metric) {
	for _, ms := range m.measures {
		ms.mu.Lock()
		up, last := 1.0, 0.0
		if ms.failing || ms.lastOK.IsZero() {
			up = 0
		}
		if !ms.lastOK.IsZero() {
			last = float64(ms.lastOK.UnixNano()) / 1e9
		}
		for _, s := range ms.samples {
			ch <- prometheus.MustNewConstMetric(m.descs[s.metric], prometheus.GaugeValue, s.value, s.labels...)
		}
		ms.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(m.up, prometheus.GaugeValue, up, ms.name)
		ch <- prometheus.MustNewConstMetric(m.last, prometheus.GaugeValue, last, ms.name)
	}
}
