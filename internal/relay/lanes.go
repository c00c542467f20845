package relay

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/streams"
)

// LaneCollector exports how the priority lanes are doing: each lane's
// backlog in JetStream (messages not yet delivered plus delivered and not
// yet answered) and the age of the oldest urgent row not yet sent, the
// figure its alert watches. Values are measured at most every few seconds
// and the last good ones kept when a measurement fails.
type LaneCollector struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	stream  string
	log     *slog.Logger
	timeout time.Duration
	maxAge  time.Duration

	mu      sync.Mutex
	at      time.Time
	backlog map[string]float64
	urgent  float64
	ok      bool

	backlogDesc, urgentDesc, upDesc *prometheus.Desc
}

// NewLaneCollector returns a LaneCollector for the lanes of the work stream.
func NewLaneCollector(pool *pgxpool.Pool, js jetstream.JetStream, log *slog.Logger) *LaneCollector {
	if log == nil {
		log = slog.Default()
	}
	return &LaneCollector{
		pool: pool, js: js, stream: streams.Stream, log: log, timeout: 3 * time.Second, maxAge: 5 * time.Second,
		backlog: map[string]float64{},
		backlogDesc: prometheus.NewDesc("sendonce_lane_backlog_messages",
			"Messages of a priority lane (urgent, normal, bulk) not yet delivered to a sender, or delivered and not yet answered.", []string{"lane"}, nil),
		urgentDesc: prometheus.NewDesc("sendonce_outbox_oldest_urgent_age_seconds",
			"Age of the oldest urgent row not yet sent (pending, queued or sending); 0 when none.", nil, nil),
		upDesc: prometheus.NewDesc("sendonce_lanes_up",
			"1 if the last measurement of the lanes succeeded.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *LaneCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.backlogDesc
	ch <- c.urgentDesc
	ch <- c.upDesc
}

// Collect implements prometheus.Collector.
func (c *LaneCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > c.maxAge {
		c.at, c.ok = time.Now(), c.measure()
	}
	for _, l := range streams.Lanes {
		ch <- prometheus.MustNewConstMetric(c.backlogDesc, prometheus.GaugeValue, c.backlog[l.Name], l.Name)
	}
	ch <- prometheus.MustNewConstMetric(c.urgentDesc, prometheus.GaugeValue, c.urgent)
	up := 0.0
	if c.ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.upDesc, prometheus.GaugeValue, up)
}

// measure refreshes the values; c.mu is held.
func (c *LaneCollector) measure() bool {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	ok := true
	for _, l := range streams.Lanes {
		cons, err := c.js.Consumer(ctx, c.stream, l.Consumer)
		if err != nil {
			c.log.Warn("measure lane backlog", "lane", l.Name, "err", err)
			ok = false
			continue
		}
		info := cons.CachedInfo()
		c.backlog[l.Name] = float64(info.NumPending) + float64(info.NumAckPending)
	}
	age, err := outbox.OldestUrgent(ctx, c.pool)
	if err != nil {
		c.log.Warn("measure the oldest urgent row", "err", err)
		return false
	}
	c.urgent = age.Seconds()
	return ok
}
