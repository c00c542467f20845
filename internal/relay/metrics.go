package relay

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	published     prometheus.Counter
	publishErrors prometheus.Counter
	batchErrors   prometheus.Counter
	batchRows     prometheus.Histogram
	batchSeconds  prometheus.Histogram
	listening     prometheus.Gauge
	// timed counts the rows the scheduler moved: due (scheduled to
	// pending) and expired (ended at their expiry without a call).
	timed *prometheus.CounterVec
}

// batchBuckets returns exponential buckets from 1ms up to at least bound:
// a batch may take up to its bound (claim, AckTimeout, mark), and a slow
// batch must land in a bucket that says how slow, not in +Inf.
func batchBuckets(bound time.Duration) []float64 {
	n := 1
	for top := 0.001; top < bound.Seconds(); top *= 2 {
		n++
	}
	return prometheus.ExponentialBuckets(0.001, 2, max(n, 14))
}

func newMetrics(reg prometheus.Registerer, batchBound time.Duration) (*metrics, error) {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_relay_published_total",
			Help: "Outbox row publications acknowledged by JetStream (duplicates included).",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_relay_publish_errors_total",
			Help: "Outbox row publications not acknowledged by JetStream (the rows stay pending for a later batch).",
		}),
		batchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_relay_batch_errors_total",
			Help: "Relay batches that failed: a database error, or a publication not acknowledged.",
		}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_relay_batch_rows",
			Help:    "Rows claimed per relay batch.",
			Buckets: []float64{1, 5, 10, 50, 100, 250, 500, 1000, 5000},
		}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_relay_batch_duration_seconds",
			Help:    "Time from claim to commit of one relay batch.",
			Buckets: batchBuckets(batchBound),
		}),
		listening: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sendonce_relay_listening",
			Help: "1 while the relay's LISTEN hears notifications (it polls every RELAY_POLL_INTERVAL), 0 while it polls alone (every RELAY_POLL_ALONE).",
		}),
		timed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_relay_timed_rows_total",
			Help: "Rows the relay's scheduler moved, by what: due (a scheduled row whose send_at came, made pending), expired (a row that reached its expires_at with no call that may have been taken, ended expired).",
		}, []string{"what"}),
	}
	m.timed.WithLabelValues("due")
	m.timed.WithLabelValues("expired")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.published, m.publishErrors, m.batchErrors, m.batchRows, m.batchSeconds, m.listening, m.timed} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("relay: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) observeBatch(claimed, queued int, d time.Duration) {
	m.batchRows.Observe(float64(claimed))
	m.batchSeconds.Observe(d.Seconds())
}
