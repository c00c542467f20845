package relay

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	published     prometheus.Counter
	publishErrors prometheus.Counter
	batchRows     prometheus.Histogram
	batchSeconds  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_relay_published_total",
			Help: "Outbox row publications acknowledged by JetStream (duplicates included).",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_relay_publish_errors_total",
			Help: "Relay batches in which at least one publication was not acknowledged.",
		}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_relay_batch_rows",
			Help:    "Rows claimed per relay batch.",
			Buckets: []float64{1, 5, 10, 50, 100, 250, 500, 1000, 5000},
		}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_relay_batch_duration_seconds",
			Help:    "Time from claim to commit of one relay batch.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.published, m.publishErrors, m.batchRows, m.batchSeconds} {
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
