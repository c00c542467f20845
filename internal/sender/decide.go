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
	// everywhere: an earlier claim found the row's records may have lost
	// an attempt and could not yet ask every other provider.
	everywhere bool
	// lastDelivery: JetStream will not deliver this message again, so a
	// retry cannot be handed back to it.
	lastDelivery bool
	// canLookup: the provider can be asked which messages it has for a
	// reference (SMS_API_LOOKUP).
	canLookup bool
	// lookupPending: the row's last attempt ended without an answer at a
	// provider without idempotency; a lookup must come before any call.
	lookupPending bool
	// lookups and lookupBudget: the row's failed lookups, and how many
	// may fail before the row ends unknown.
	lookups, lookupBudget int
	// republished: the row's message is a republication (publish_gen > 0):
	// the reconciler found the row stuck, parked or rolled back, an
	// operator replayed it, or a failover lost what the row said of an
	// earlier attempt. Its history is not to be trusted blindly.
	republished bool
	// redelivered: this delivery is not its message's first, and the row
	// does not show the claim of the delivery before it: a failover may
	// have lost that claim, its call and its outcome with the old primary
	// (the row then reads as if nothing had happened), so the row's history
	// is not to be trusted blindly. A retry's redelivery, whose previous
	// claim the row shows with what it did, is not one.
	redelivered bool
	// beyondDedup: the row's first claim comes later than the broker
	// remembers publications (older than the stream's duplicate window, or
	// than the stream itself): an earlier publication of the same row,
	// claimed and called before a database rewind (a failover that lost
	// the claim, a point-in-time restore), would not have been dropped as
	// a duplicate, so this first call may be a second one.
	beyondDedup bool
	// pastRetention: the row is older than the provider keeps messages
	// visible to lookups, so a lookup that finds nothing proves nothing.
	pastRetention bool
	// lookupWait is how long before a lookup may be made: the settle time
	// after the last attempt that may have reached the provider (a stale
	// claim's lease, a missed write's mark) is not over yet.
	lookupWait time.Duration
	// expired: the row's expires_at has come. No call may start now; what
	// an earlier attempt may have done is settled by evidence only.
	expired bool
	// suppressed: the row's number was on the suppression list when it
	// was claimed. No call may start; what an earlier attempt may have
	// done is settled by evidence only, as for expired.
	suppressed bool
}

// marked reports whether an earlier attempt may have been taken, by what
// the database's claim reads before it ends a row expired: a stale claim,
// maybe_accepted, a lookup pending, a lookup owed to every other
// provider, a redelivery whose previous delivery the row does not account
// for.
func (f facts) marked() bool {
	return f.stale || f.maybeAccepted || f.lookupPending || f.everywhere || f.redelivered
}

// looksUp reports whether an attempt without an answer is settled by a
// lookup rather than ended unknown.
func (f facts) looksUp() bool { return f.canLookup && !f.idempotent }

// uncertain reports whether the row's records may have lost an attempt
// (not only its answer): a sender that died mid-call, a redelivery whose
// previous claim the row does not show, a republication, a first
// publication past the dedup window. With several providers, such a row
// may be held by a provider it does not name.
func (f facts) uncertain() bool {
	return f.stale || f.republished || f.redelivered || f.beyondDedup || f.everywhere
}

// doubtful reports whether an earlier attempt of the row may have reached
// the provider, by what the row says or by what it may have lost.
func (f facts) doubtful() bool {
	return f.lookupPending || f.maybeAccepted || f.stale || f.republished || f.redelivered || f.beyondDedup
}

// policy is the sender's settings a decision needs, and the random draw.
type policy struct {
	// backoff is this attempt's full-jitter delay, drawn by the caller.
	backoff time.Duration
	// maxNakDelay is the longest wait handed back to JetStream.
	maxNakDelay time.Duration
	// settle is how long after an attempt without an answer the provider
	// is looked up (SMS_API_LOOKUP_SETTLE): time for it to show a request
	// it accepted.
	settle time.Duration
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
	// lookup: ask the provider what became of earlier attempts before
	// anything else (a decision before the call only).
	lookup bool
	// lookupPending: the retry begins with a lookup.
	lookupPending bool
	// lookupFailed counts a failed lookup against the row's budget.
	lookupFailed bool
	// notAccepted: a lookup found no message for the reference, so no
	// earlier attempt reached the provider; the row's maybe_accepted mark
	// is cleared.
	notAccepted bool
	// ref is the provider's id for the message, found by a lookup.
	ref string
	// elsewhere names another provider of the list that may have the
	// message and could not be asked: a replay to the row's own provider
	// could send it twice, whatever that one does with keys.
	elsewhere string
	// heldBack names why a claimed row waits without an attempt: its
	// lookup is not due yet (lookup_wait), or the lease has too little
	// time left for the call (no_time).
	heldBack string
	// suppress puts the row's number on the suppression list with the
	// status write: the provider refused the call because the recipient
	// opted out.
	suppress bool
}

// decide maps what is known of a claimed row, and the provider's answer when
// one was made (o nil before the call), to a verdict. It does no I/O.
func decide(f facts, o *provider.Outcome, p policy) verdict {
	if o == nil {
		return decideBefore(f, p)
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
		if o.OptedOut {
			return decideOptedOut(f, o)
		}
		// A refusal now says nothing of an earlier attempt whose answer was
		// lost (a rotated key, an expired key store).
		v := unsent(f.maybeAccepted, wire.ReasonPermanent, o.Error())
		v.outcome = "permanent"
		return v
	case provider.Expired:
		// The client sent nothing: the expiry came before the request
		// could leave. What an earlier attempt did is settled as for any
		// expired row.
		f.expired = true
		v := decideExpired(f, p)
		if v.lookup {
			v = deferLookup(f, p)
		}
		return v
	case provider.Ambiguous:
		if f.looksUp() {
			// The provider may have the message: ask it, once it has had
			// the settle time to show it, before anything else is sent.
			// Even on the last attempt: a lookup settles it either way.
			v := verdict{status: outbox.StatusQueued, errText: o.Error() + "; the provider will be asked whether it has the message",
				action: nak, delay: p.settle, maybe: true, outcome: "ambiguous", lookupPending: true}
			if f.lastDelivery || v.delay > p.maxNakDelay {
				v.action, v.park = ack, true
			}
			return v
		}
		return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous, errText: o.Error(),
			action: term, maybe: true, outcome: "ambiguous", letter: true}
	}
	v := unsent(f.maybeAccepted, wire.ReasonPermanent, "unclassified provider outcome")
	v.outcome = "permanent"
	return v
}

// decideBefore decides whether a claimed row may be called at all.
func decideBefore(f facts, p policy) verdict {
	if f.expired {
		return decideExpired(f, p)
	}
	if f.suppressed {
		return decideSuppressed(f, p)
	}
	switch {
	case f.looksUp() && f.doubtful() && f.lookupWait > 0:
		// The provider would be asked before it has had the settle time
		// to show what the last attempt did: ask later, spending nothing.
		return deferLookup(f, p)
	case f.looksUp() && f.doubtful():
		// An earlier attempt ended without an answer (or died mid-call) at
		// a provider that would send again: what it did is asked, not
		// guessed. So is any row whose history may have been lost: a
		// Postgres failover can lose the writes that said an attempt was
		// made (the claim, the lookup mark, even sent), and only a
		// redelivery, a republication or a late first publication brings
		// such a row back. This comes before the budget: a lookup may find
		// the message sent.
		return verdict{lookup: true}
	case f.stale && !f.idempotent:
		// An earlier attempt died mid-call at a provider that would send
		// again: the outcome is unknowable, and a call could double-send.
		// This comes first: even with the budget spent, "dead" would invite
		// a replay of a message that may have been delivered.
		return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
			errText: "an earlier attempt ended without an outcome (its sender died or lost the database mid-call)",
			action:  term, maybe: true, outcome: "ambiguous", letter: true}
	case !f.idempotent && !f.canLookup && f.lookupPending:
		// An attempt ended without an answer, and its write missed its
		// claim (a failover lost the claim, or another claim took the row):
		// the provider may have the message, cannot be asked and would
		// send again. Caution wins.
		return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
			errText: "an earlier attempt ended without an answer and the provider cannot be asked whether it has the message",
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

// deferLookup puts a row whose lookup is due later back to wait for it:
// queued, its lookup pending, the claim's attempt given back.
func deferLookup(f facts, p policy) verdict {
	v := verdict{status: outbox.StatusQueued, action: nak, delay: f.lookupWait, maybe: f.maybeAccepted, lookupPending: true, refund: true, heldBack: "lookup_wait",
		errText: fmt.Sprintf("an earlier attempt may have reached the provider; it is asked in %s, once the settle time has passed", f.lookupWait.Round(time.Millisecond))}
	if f.lastDelivery || v.delay > p.maxNakDelay {
		v.action, v.park = ack, true
	}
	return v
}

// decideNoTime is the verdict for a claim whose lease has too little left
// for the provider call: no call (it could outlive the lease and overlap
// the next claim's), the attempt given back, and the row claimed again soon.
// A lookup that was due and not made stays pending.
func decideNoTime(f facts, lookedUp bool, p policy) verdict {
	v := verdict{status: outbox.StatusQueued, action: nak, delay: p.backoff, refund: true, heldBack: "no_time",
		lookupPending: f.looksUp() && f.doubtful() && !lookedUp,
		errText:       "the claim's lease had too little time left for the provider call; claimed again"}
	if f.lastDelivery || v.delay > p.maxNakDelay {
		v.action, v.park = ack, true
	}
	return v
}

// lookupOf names a lookup's answer in the evidence and the attempts log:
// found, none, several or failed.
func lookupOf(r provider.LookupResult) string {
	switch {
	case r.Err != nil:
		return "failed"
	case len(r.Found) == 0:
		return "none"
	case len(r.Found) == 1:
		return "found"
	}
	return "several"
}

// decideLookup maps a lookup's answer to a verdict. A lookup is not an
// attempt to send: every verdict but "none" gives the claim's attempt back.
// "none" returns {call: true, notAccepted: true}: the earlier attempts never
// reached the provider, and the message is sent now with the same
// reference, budget allowing (decideAfterNone).
func decideLookup(f facts, r provider.LookupResult, p policy) verdict {
	switch lookupOf(r) {
	case "failed":
		if f.lookups+1 >= f.lookupBudget {
			return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
				errText: fmt.Sprintf("the provider could not be asked whether it has the message (%d lookups failed); last: %v", f.lookups+1, r.Err),
				action:  term, maybe: true, outcome: "lookup", letter: true, lookupFailed: true, refund: true}
		}
		v := verdict{status: outbox.StatusQueued, errText: fmt.Sprintf("lookup failed: %v; asking again later", r.Err),
			action: nak, delay: max(p.settle, p.backoff), maybe: true, outcome: "lookup",
			lookupPending: true, lookupFailed: true, refund: true}
		if f.lastDelivery || v.delay > p.maxNakDelay {
			v.action, v.park = ack, true
		}
		return v
	case "none":
		if f.pastRetention {
			// The provider may have forgotten a message it took: caution.
			return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
				errText: "the provider has no message for this reference, but the row is older than the provider keeps messages for lookups (SMS_API_LOOKUP_RETENTION): an earlier attempt may have reached it",
				action:  term, maybe: true, outcome: "lookup", letter: true, refund: true}
		}
		return verdict{call: true, notAccepted: true}
	case "found":
		m := r.Found[0]
		status := outbox.StatusSent
		switch m.Status {
		case "delivered":
			status = outbox.StatusDelivered
		case "undelivered":
			status = outbox.StatusUndelivered
		}
		return verdict{status: status, action: ack, outcome: "lookup", ref: m.Ref, refund: true}
	}
	return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
		errText: fmt.Sprintf("the provider has %d messages for this reference: it was sent more than once", len(r.Found)),
		action:  term, maybe: true, outcome: "lookup", letter: true, refund: true}
}

// decideExpired decides a row whose expiry has come: no call, ever. A row
// that nothing marks as possibly taken ends expired (the attempt given
// back). One an earlier attempt may have reached is settled by evidence,
// never expired: the provider is asked where it can be (once the settle
// time has passed), and the row ends unknown where it cannot, for a
// receipt or a person to settle.
func decideExpired(f facts, p policy) verdict {
	switch {
	case !f.marked():
		return expiredVerdict()
	case f.canLookup && !f.pastRetention && !f.lookupPending:
		// The provider has the settle time to show an attempt it took
		// before it is asked: the last one may have been just now (a
		// retry under the key at a provider that honours it is due within
		// a second).
		f.lookupWait = max(f.lookupWait, p.settle)
		return deferLookup(f, p)
	case f.canLookup && !f.pastRetention && f.lookupWait > 0:
		return deferLookup(f, p)
	case f.canLookup && !f.pastRetention:
		return verdict{lookup: true}
	}
	return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
		errText: "expired while an earlier attempt may have reached the provider, which cannot be asked: no call after expires_at; a receipt or a person settles it",
		action:  term, maybe: true, outcome: "ambiguous", letter: true, refund: true}
}

// expiredVerdict ends a row that no call may have reached at its expiry:
// expired, acked, the claim's attempt given back.
func expiredVerdict() verdict {
	return verdict{status: outbox.StatusExpired, errText: "expired before any provider call", action: ack, outcome: "expired", refund: true}
}

// decideSuppressed decides a row whose number was on the suppression list
// when it was claimed: no call, ever, as for an expired row
// (decideExpired). A row nothing marks as possibly taken ends suppressed
// (the database's claim ends such a row itself; this one was claimed
// before the number was listed, by a claim run again for its lost
// answer). One an earlier attempt may have reached is settled by
// evidence, never suppressed and never called: the provider is asked
// where it can be, and the row ends unknown where it cannot.
func decideSuppressed(f facts, p policy) verdict {
	switch {
	case !f.marked():
		return suppressedVerdict()
	case f.canLookup && f.lookupWait > 0:
		return deferLookup(f, p)
	case f.canLookup:
		return verdict{lookup: true}
	}
	return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous,
		errText: "the number is on the suppression list while an earlier attempt may have reached the provider, which cannot be asked: no call to a suppressed number; a receipt or a person settles it",
		action:  term, maybe: true, outcome: "ambiguous", letter: true, refund: true}
}

// suppressedVerdict ends a row that no call may have reached, whose number
// is on the suppression list: suppressed, acked, the claim's attempt given
// back.
func suppressedVerdict() verdict {
	return verdict{status: outbox.StatusSuppressed, errText: "suppressed before any provider call: the number is on the suppression list",
		action: ack, refund: true}
}

// decideOptedOut decides a call the provider refused because the
// recipient opted out: the number goes on the suppression list, so that no
// provider is called for it again, and the row ends suppressed (the
// attempt was spent: the call was made). Where an earlier attempt may have
// reached a provider, the row is never suppressed (it may have been sent):
// it ends unknown, as any refusal then does, and the number still goes on
// the list.
func decideOptedOut(f facts, o *provider.Outcome) verdict {
	if f.maybeAccepted {
		v := unsent(true, wire.ReasonPermanent, "the recipient opted out: "+o.Error()+"; the number is on the suppression list")
		v.outcome, v.suppress = "permanent", true
		return v
	}
	return verdict{status: outbox.StatusSuppressed, action: ack, outcome: "permanent", suppress: true,
		errText: "suppressed: the provider refused the message because the recipient opted out (" + o.Error() + "); the number is on the suppression list"}
}

// decideAfterNone decides the call that follows a lookup that found
// nothing: no earlier attempt reached the provider, so a row past its
// expiry ends expired, one whose number is on the suppression list ends
// suppressed and one whose budget is spent ends dead (nothing was sent),
// else the call goes ahead.
func decideAfterNone(f facts) verdict {
	if f.expired {
		v := expiredVerdict()
		v.notAccepted = true
		return v
	}
	if f.suppressed {
		v := suppressedVerdict()
		v.notAccepted = true
		return v
	}
	if f.attempt > f.maxAttempts {
		v := unsent(false, wire.ReasonMaxAttempts,
			fmt.Sprintf("attempts exhausted (%d of %d); the provider has no message for this reference", f.maxAttempts, f.maxAttempts))
		v.outcome, v.notAccepted = "max_attempts", true
		return v
	}
	return verdict{call: true, notAccepted: true}
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

// decideUnknown decides a row that names a provider this sender was not
// given (a rolling change of SMS_PROVIDERS): the row may be that
// provider's, so it waits for a sender that has it, and is never sent
// elsewhere. The attempt is given back; on the message's last delivery the
// row is parked for the reconciler.
func decideUnknown(f facts, p policy) verdict {
	v := verdict{status: outbox.StatusQueued, action: nak, delay: max(p.maxNakDelay, time.Second), refund: true,
		errText: "the row's provider is not among this sender's SMS_PROVIDERS; waiting for a sender that has it"}
	if f.lastDelivery {
		v.action, v.park = ack, true
	}
	return v
}
