package receiver

import (
	"fmt"
	"net/url"

	"github.com/prometheus/client_golang/prometheus"
)

// results are the values of sendonce_receipts_total's result label.
var results = []string{
	"applied", "settled_unknown", "unchanged", "unknown_reference", "refused", "contradicted", "ignored",
	"forged", "stale", "malformed", "oversize", "error",
}

// inboundResults are the values of sendonce_inbound_total's result label.
var inboundResults = []string{
	"suppressed", "lifted", "unchanged", "kept", "ignored", "invalid_number",
	"forged", "stale", "malformed", "oversize", "error",
}

type metrics struct {
	receipts     *prometheus.CounterVec
	inbound      *prometheus.CounterVec
	commits      prometheus.Counter
	writeErrors  prometheus.Counter
	batch        prometheus.Histogram
	writeSeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		receipts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_receipts_total",
			Help: "Receipts received, by source (generic, twilio, vonage, sinch, telnyx) and result: applied (moved the row), settled_unknown (moved an unknown row), unchanged (repeated or older news), unknown_reference, refused (valid, but for another provider's row, a row no provider was asked to send, or another message than the row's: answered 200, nothing changed), contradicted (a receipt for a row recorded dead, which now follows the receipt), ignored (a status with nothing to learn), forged, stale, malformed, oversize, error (not written; answered 503).",
		}, []string{"source", "result"}),
		inbound: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_inbound_total",
			Help: "Inbound messages (recipients' replies) received, by source (generic, twilio, vonage, sinch, telnyx) and result: suppressed (an opt-out keyword put the number on the suppression list), lifted (an opt-in keyword removed it), unchanged (already on it; or not on it), kept (an opt-in for a number an operator or an import listed: only an operator removes it), ignored (no keyword: nothing kept), invalid_number (a keyword from a sender that is no E.164 number), forged, stale, malformed, oversize, error (not written; answered 503).",
		}, []string{"source", "result"}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_receipt_commits_total",
			Help: "Transactions that wrote receipts: receipts written together share one.",
		}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_receipt_write_errors_total",
			Help: "Receipt batches whose write failed (tried again until the write deadline).",
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_receipt_batch_size",
			Help:    "Receipts written per transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_receipt_write_seconds",
			Help:    "Wall time of one batch's write, from its first try to its commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	for _, s := range []string{"generic", "twilio", "vonage", "sinch", "telnyx"} {
		for _, r := range results {
			m.receipts.WithLabelValues(s, r)
		}
		for _, r := range inboundResults {
			m.inbound.WithLabelValues(s, r)
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.receipts, m.inbound, m.commits, m.writeErrors, m.batch, m.writeSeconds} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("receiver: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) count(source, result string) { m.receipts.WithLabelValues(source, result).Inc() }

// parseForm parses a form-encoded body.
func parseForm(body []byte) (url.Values, error) { return url.ParseQuery(string(body)) }
