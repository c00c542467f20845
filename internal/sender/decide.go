package sender

import (
	"fmt"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/wire"
)

// action is what to tell JetStream once the status write committed.
type action int

const (
	ack action = iota + 1
	nak
	term
)

func (a action) String() string {
	switch a {
	case ack:
		return "ack"
	case nak:
		return "nak"
	case term:
		return "term"
	}
	return "none"
}

// facts are what a sender knows of a claimed row when it decides.
type facts struct {
	// stale: the claim took over another claim's expired lease, whose
	// attempt never reported back.
	stale bool
	// idempotent: the provider honours idempotency keys.
	idempotent bool
	// attempt and maxAttempts: this attempt's number and the row's budget.
	attempt, maxAttempts int
	// maybeAccepted: an earlier attempt may have reached the provider.
	maybeAccepted bool
	// lastDelivery: JetStream will not deliver this message again, so a
	// retry cannot be handed back to it.
	lastDelivery bool
}

// policy is the sender's settings a decision needs, and the random draw.
type policy struct {
	// backoff is this attempt's full-jitter delay, drawn by the caller.
	backoff time.Duration
	// maxNakDelay is the longest wait handed back to JetStream.
	maxNakDelay time.Duration
}

// verdict is what to do about one attempt: whether to call the provider,
// and what to write, publish and answer.
type verdict struct {
	// call: make the provider call (a decision before the call only).
	call bool
	// status is the row's new status; empty writes nothing.
	status outbox.State
	// reason is the dead-letter reason of a dead or unknown row.
	reason string
	// errText is the row's last_error, without personal data.
	errText string
	// action answers JetStream after the write; delay is a nak's delay and
	// a retry's wait in the row.
	action action
	delay  time.Duration
	// park keeps a retry in Postgres: the message is acked, and the
	// reconciler republishes the row once it is due.
	park bool
	// maybe marks an attempt that may have reached the provider.
	maybe bool
	// outcome is the attempts-log class; empty records nothing.
	outcome string
	// letter: publish the row's dead letter once its status is written.
	letter bool
	// refund gives the attempt back: the provider took nothing and asked
	// to slow down (429), which is flow control, not a failure.
	refund bool
	// pause asks every sender to wait delay: the provider said how long
	// (a 429 or 503 with Retry-After).
	pause bool
}

// decide maps what is known of a claimed row, and the provider's answer when
// one was made (o nil before the call), to a verdict. It does no I/O.
func decide(f facts, o *provider.Outcome, p policy) verdict {
	if o == nil {
		return decideBefore(f)
	}
	switch o.Kind {
	case provider.Sent:
		return verdict{status: outbox.StatusSent, action: ack, outcome: "sent"}
	case provider.Retry:
		if o.HTTPStatus == 429 {
			// Rate limited: the provider refused to take the request at
			// all. It spends no attempt (a provider's limit delays a
			// message, never kills it) and, with a Retry-After, pauses
			// every sender rather than this message alone.
			d := o.After
			if d == 0 {
				d = p.backoff
			}
			v := verdict{status: outbox.StatusQueued, errText: o.Error(), action: nak, delay: d,
				outcome: "rate_limited", refund: true, pause: o.After > 0}
			if f.lastDelivery || v.delay > p.maxNakDelay {
				v.action, v.park = ack, true
			}
			return v
		}
		if f.attempt >= f.maxAttempts {
			v := unsent(f.maybeAccepted || o.MaybeAccepted, wire.ReasonMaxAttempts,
				fmt.Sprintf("attempts exhausted (%d of %d); last: %s", f.attempt, f.maxAttempts, o.Error()))
			v.outcome, v.maybe = "retry", o.MaybeAccepted
			return v
		}
		d := o.After
		if d == 0 {
			d = p.backoff
		}
		v := verdict{status: outbox.StatusQueued, errText: o.Error(), action: nak, delay: d,
			maybe: o.MaybeAccepted, outcome: "retry", pause: o.HTTPStatus == 503 && o.After > 0}
		if f.lastDelivery || d > p.maxNakDelay {
			// JetStream would not bring the message back (its last
			// delivery), or would hold a MaxAckPending slot all the wait:
			// ack, and let the reconciler republish the row when due. The
			// attempt budget is the row's, never the consumer's.
			v.action, v.park = ack, true
		}
		return v
	case provider.Permanent:
		// A refusal now says nothing of an earlier attempt whose answer was
		// lost (a rotated key, an expired key store).
		v := unsent(f.maybeAccepted, wire.ReasonPermanent, o.Error())
		v.outcome = "permanent"
		return v
	case provider.Ambiguous:
		return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous, errText: o.Error(),
			action: term, maybe: true, outcome: "ambiguous", letter: true}
	}
	v := unsent(f.maybeAccepted, wire.ReasonPermanent, "unclassified provider outcome")
	v.outcome = "permanent"
	return v
}

// decideBefore decides whether a claimed row may be called at all.
func decideBefore(f facts) verdict {
	switch {
	case f.stale && !f.idempotent:
		// An earlier attempt died mid-call at a provider that would send
		// again: the outcome is unknowable, and a call could double-send.
		// This comes first: even with the budget spent, "dead" would invite
		// a replay of a message that may have been delivered.
		return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
			errText: "an earlier attempt ended without an outcome (its sender died or lost the database mid-call)",
			action:  term, maybe: true, outcome: "ambiguous", letter: true}
	case f.attempt > f.maxAttempts && !f.stale:
		// A safety net: a retry on the last attempt already finishes the
		// row. A stale claim at an idempotent provider calls again even
		// past the budget: the same key makes the provider replay the dead
		// attempt's outcome, so this learns it without sending twice.
		v := unsent(f.maybeAccepted, wire.ReasonMaxAttempts,
			fmt.Sprintf("attempts exhausted (%d of %d)", f.maxAttempts, f.maxAttempts))
		v.outcome = "max_attempts"
		return v
	}
	return verdict{call: true}
}

// unsent is the verdict for a row that will not be sent for reason: dead
// when no attempt may have reached the provider, else unknown (see
// outbox.Unsent), with the text saying why.
func unsent(maybeAccepted bool, reason, msg string) verdict {
	status, reason := outbox.Unsent(maybeAccepted, reason)
	if status == outbox.StatusUnknown {
		msg += "; an attempt may have reached the provider"
	}
	return verdict{status: status, reason: reason, errText: msg, action: term, letter: true}
}
