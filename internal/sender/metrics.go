package sender

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/outbox"
)

type metrics struct {
	outcomes        *prometheus.CounterVec
	decisions       *prometheus.CounterVec
	heldBack        *prometheus.CounterVec
	deadLetters     *prometheus.CounterVec
	providerSeconds prometheus.Histogram
	commitToSent    prometheus.Histogram
	redeliveries    prometheus.Counter
	skipped         prometheus.Counter
	leased          prometheus.Counter
	handedBack      prometheus.Counter
	lettersDeferred prometheus.Counter
	overtaken       prometheus.Counter
	dbRetries       *prometheus.CounterVec
	dlqRetries      prometheus.Counter
	laneTaken       *prometheus.CounterVec
	lookups         *prometheus.CounterVec
	batchRows       *prometheus.HistogramVec
	suppressed      *prometheus.CounterVec
	// providerState, providerCalls and failovers are SMS_PROVIDERS' (routes.go).
	providerState *prometheus.GaugeVec
	providerCalls *prometheus.CounterVec
	failovers     *prometheus.CounterVec
	// claimRows and writeRows are batchRows' two series, resolved once.
	claimRows, writeRows prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_attempts_total",
			Help: "Provider attempts (calls made) by outcome class (sent, retry, permanent, ambiguous).",
		}, []string{"outcome"}),
		// Decisions are kept apart from attempts: an error ratio over
		// attempts must not count messages finished without a call.
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_decisions_total",
			Help: "Messages finished without a provider call, by decision: ambiguous (an earlier attempt died mid-call at a provider without idempotency), max_attempts (budget spent), invalid (not a relay message), expired (its expires_at came before any call), suppressed (its number is on the suppression list).",
		}, []string{"decision"}),
		heldBack: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_held_back_total",
			Help: "Claimed messages put back to wait without an attempt, by why: lookup_wait (the provider is asked about an earlier attempt only once the settle time has passed), no_time (the claim's lease had too little time left for the call), provider_unknown (the row belongs to a provider not in this sender's SMS_PROVIDERS).",
		}, []string{"why"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_dead_letters_total",
			Help: "Dead letters published, by reason.",
		}, []string{"reason"}),
		providerSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_provider_request_duration_seconds",
			Help:    "Wall time of one provider attempt.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		commitToSent: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sendonce_commit_to_sent_seconds",
			Help:    "Time from the outbox insert to the committed sent status.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}),
		redeliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_redeliveries_total",
			Help: "Messages received more than once from JetStream.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_terminal_skips_total",
			Help: "Deliveries acked without a call because the row was already terminal.",
		}),
		leased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_lease_backoffs_total",
			Help: "Deliveries backed off because another attempt held the row or it awaited its retry time.",
		}),
		handedBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_handed_back_total",
			Help: "Deliveries handed back to JetStream unclaimed (a graceful stop, a back-off from a live claim) and recorded in their rows, so that the next delivery is not taken for a lost attempt.",
		}),
		lettersDeferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_dead_letters_deferred_total",
			Help: "Dead letters not queued in memory because the sender already held as many as it may while the dead-letter stream refused them: their rows keep no letter, and the reconciler publishes them once the stream takes letters again.",
		}),
		overtaken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_overtaken_writes_total",
			Help: "Attempt outcomes not written because another attempt had taken the row over.",
		}),
		dbRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_db_retries_total",
			Help: "Claims and status writes tried again after a database failure, by operation (claim, status_write); the messages are held meanwhile.",
		}, []string{"op"}),
		dlqRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_dead_letter_retries_total",
			Help: "Dead-letter publications tried again after a failure.",
		}),
		laneTaken: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_lane_messages_total",
			Help: "Messages taken from each priority lane (urgent, normal, bulk) for a claim.",
		}, []string{"lane"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_lookups_total",
			Help: "Lookups of earlier attempts at a provider without idempotency, by result: found (settled from the provider's record), none (never accepted; sent again), several (sent more than once; unknown), failed (asked again later).",
		}, []string{"result"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_suppressed_messages_total",
			Help: "Messages ended suppressed (never sent: the number is on the suppression list), by the source of the number's entry: inbound (the recipient's STOP), refusal (a provider refused a send as opted out: this message's own call, or an earlier one's), receipt, operator, import, app.",
		}, []string{"source"}),
		batchRows: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sendonce_sender_batch_rows",
			Help:    "Rows in each claim and each status write (op claim, status_write): how well a busy sender batches (SENDER_CLAIM_LINGER, SENDER_WRITE_LINGER).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}, []string{"op"}),
	}
	// Every series exists from the start at 0, so that rate() and
	// increase() see the first event of a kind.
	for _, o := range []string{"sent", "retry", "rate_limited", "permanent", "ambiguous"} {
		m.outcomes.WithLabelValues(o)
	}
	for _, d := range []string{"ambiguous", "max_attempts", "invalid", "expired", "suppressed"} {
		m.decisions.WithLabelValues(d)
	}
	for _, r := range []string{"permanent", "max_attempts", "ambiguous", "invalid"} {
		m.deadLetters.WithLabelValues(r)
	}
	for _, w := range []string{"lookup_wait", "no_time", "provider_unknown"} {
		m.heldBack.WithLabelValues(w)
	}
	for _, op := range []string{"claim", "status_write"} {
		m.dbRetries.WithLabelValues(op)
	}
	m.claimRows, m.writeRows = m.batchRows.WithLabelValues("claim"), m.batchRows.WithLabelValues("status_write")
	for _, l := range []string{"urgent", "normal", "bulk"} {
		m.laneTaken.WithLabelValues(l)
	}
	for _, r := range []string{"found", "none", "several", "failed"} {
		m.lookups.WithLabelValues(r)
	}
	for _, src := range outbox.Sources {
		m.suppressed.WithLabelValues(src)
	}
	routes := providerMetrics(m)
	if reg != nil {
		for _, c := range append([]prometheus.Collector{m.outcomes, m.decisions, m.heldBack, m.deadLetters, m.providerSeconds, m.commitToSent, m.redeliveries, m.skipped, m.leased, m.handedBack, m.lettersDeferred, m.overtaken, m.dbRetries, m.dlqRetries, m.laneTaken, m.lookups, m.batchRows, m.suppressed}, routes...) {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("sender: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// suppressedRow counts a message ended suppressed, by its number's entry's
// source (one of outbox.Sources; another is counted as operator), and, when
// no call was made for it, as a decision.
func (m *metrics) suppressedRow(source string, called bool) {
	if !slices.Contains(outbox.Sources, source) {
		source = outbox.SourceOperator
	}
	m.suppressed.WithLabelValues(source).Inc()
	if !called {
		m.decisions.WithLabelValues("suppressed").Inc()
	}
}

// count records a verdict's class: a provider attempt's outcome when a call
// was made, else the decision made without one.
func (m *metrics) count(called bool, outcome string) {
	switch {
	case called:
		m.outcomes.WithLabelValues(outcome).Inc()
	case outcome != "":
		m.decisions.WithLabelValues(outcome).Inc()
	}
}
