package sender

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
)

// decide is the whole of the sender's judgement: every outcome a provider
// call, or its absence, can have, against what the row tells.
func TestDecide(t *testing.T) {
	t.Parallel()
	p := policy{backoff: 700 * time.Millisecond, maxNakDelay: 30 * time.Second, settle: 10 * time.Second}
	fresh := facts{idempotent: true, attempt: 1, maxAttempts: 8}
	with := func(f facts, edit func(*facts)) facts { edit(&f); return f }
	sent := &provider.Outcome{Kind: provider.Sent, Ref: "msg_1", HTTPStatus: 201}
	r503 := &provider.Outcome{Kind: provider.Retry, HTTPStatus: 503, Reason: "unavailable"}
	r429 := &provider.Outcome{Kind: provider.Retry, HTTPStatus: 429, After: 2 * time.Second, Reason: "slow down"}
	longWait := &provider.Outcome{Kind: provider.Retry, HTTPStatus: 429, After: 10 * time.Minute, Reason: "slow down"}
	lost := &provider.Outcome{Kind: provider.Retry, Reason: "no response after the request was sent: timeout", MaybeAccepted: true}
	perm := &provider.Outcome{Kind: provider.Permanent, HTTPStatus: 400, Code: 21211, Reason: "invalid To"}
	amb := &provider.Outcome{Kind: provider.Ambiguous, Reason: "no response after the request was sent: timeout", MaybeAccepted: true}
	optedOut := &provider.Outcome{Kind: provider.Permanent, HTTPStatus: 400, Code: 21610, Reason: "Attempt to send to unsubscribed recipient", OptedOut: true}

	tests := []struct {
		name string
		f    facts
		o    *provider.Outcome
		want verdict
	}{
		{"fresh claim calls", fresh, nil, verdict{call: true}},
		{"stale claim at an idempotent provider calls (the key replays)", with(fresh, func(f *facts) { f.stale = true }), nil, verdict{call: true}},
		{"stale claim past the budget at an idempotent provider still calls", with(fresh, func(f *facts) { f.stale, f.attempt = true, 9 }), nil, verdict{call: true}},
		{"stale claim at a provider without idempotency ends unknown", with(fresh, func(f *facts) { f.stale, f.idempotent = true, false }), nil,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "ambiguous", letter: true}},
		{"over budget without a call ends dead", with(fresh, func(f *facts) { f.attempt = 9 }), nil,
			verdict{status: outbox.StatusDead, reason: "max_attempts", action: term, outcome: "max_attempts", letter: true}},
		{"over budget after a maybe-accepted attempt ends unknown", with(fresh, func(f *facts) { f.attempt, f.maybeAccepted = 9, true }), nil,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, outcome: "max_attempts", letter: true}},

		{"sent", fresh, sent, verdict{status: outbox.StatusSent, action: ack, outcome: "sent"}},
		{"503 retries after the backoff", fresh, r503, verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, outcome: "retry"}},
		{"429 with Retry-After: no attempt spent, every sender paused", fresh, r429,
			verdict{status: outbox.StatusQueued, action: nak, delay: 2 * time.Second, outcome: "rate_limited", refund: true, pause: true}},
		{"429 without Retry-After: no attempt spent, backs off alone", fresh, &provider.Outcome{Kind: provider.Retry, HTTPStatus: 429},
			verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, outcome: "rate_limited", refund: true}},
		{"429 on the last attempt never ends the row", with(fresh, func(f *facts) { f.attempt = 8 }), r429,
			verdict{status: outbox.StatusQueued, action: nak, delay: 2 * time.Second, outcome: "rate_limited", refund: true, pause: true}},
		{"a long Retry-After parks in Postgres", fresh, longWait,
			verdict{status: outbox.StatusQueued, action: ack, delay: 10 * time.Minute, park: true, outcome: "rate_limited", refund: true, pause: true}},
		{"503 with Retry-After pauses every sender", fresh, &provider.Outcome{Kind: provider.Retry, HTTPStatus: 503, After: 3 * time.Second},
			verdict{status: outbox.StatusQueued, action: nak, delay: 3 * time.Second, outcome: "retry", pause: true}},
		{"the last delivery with attempts left parks, never dead", with(fresh, func(f *facts) { f.lastDelivery = true }), r503,
			verdict{status: outbox.StatusQueued, action: ack, delay: 700 * time.Millisecond, park: true, outcome: "retry"}},
		{"a lost answer at an idempotent provider retries, marked", fresh, lost,
			verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, maybe: true, outcome: "retry"}},
		{"the last attempt's retry ends dead", with(fresh, func(f *facts) { f.attempt = 8 }), r503,
			verdict{status: outbox.StatusDead, reason: "max_attempts", action: term, outcome: "retry", letter: true}},
		{"the last attempt's lost answer ends unknown", with(fresh, func(f *facts) { f.attempt = 8 }), lost,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "retry", letter: true}},
		{"the last attempt after an earlier lost answer ends unknown", with(fresh, func(f *facts) { f.attempt, f.maybeAccepted = 8, true }), r503,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, outcome: "retry", letter: true}},
		{"permanent ends dead", fresh, perm, verdict{status: outbox.StatusDead, reason: "permanent", action: term, outcome: "permanent", letter: true}},
		{"permanent after a lost answer ends unknown", with(fresh, func(f *facts) { f.maybeAccepted = true }), perm,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, outcome: "permanent", letter: true}},
		{"ambiguous ends unknown", with(fresh, func(f *facts) { f.idempotent = false }), amb,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "ambiguous", letter: true}},
		{"ambiguous with lookups waits the settle time, then looks up", with(fresh, func(f *facts) { f.idempotent, f.canLookup = false, true }), amb,
			verdict{status: outbox.StatusQueued, action: nak, delay: 10 * time.Second, maybe: true, outcome: "ambiguous", lookupPending: true}},
		{"ambiguous on the last attempt still looks up", with(fresh, func(f *facts) { f.idempotent, f.canLookup, f.attempt = false, true, 8 }), amb,
			verdict{status: outbox.StatusQueued, action: nak, delay: 10 * time.Second, maybe: true, outcome: "ambiguous", lookupPending: true}},
		{"a pending lookup comes before anything else", with(fresh, func(f *facts) { f.idempotent, f.canLookup, f.lookupPending, f.attempt = false, true, true, 9 }), nil,
			verdict{lookup: true}},
		{"a stale claim with lookups looks up", with(fresh, func(f *facts) { f.idempotent, f.canLookup, f.stale = false, true, true }), nil,
			verdict{lookup: true}},
		{"a republished row looks up (a failover may have lost its history)", with(fresh, func(f *facts) { f.idempotent, f.canLookup, f.republished = false, true, true }), nil,
			verdict{lookup: true}},
		{"a republished row without lookups calls", with(fresh, func(f *facts) { f.idempotent, f.republished = false, true }), nil,
			verdict{call: true}},
		{"a redelivery looks up (a failover may have lost the claim of the delivery before)", with(fresh, func(f *facts) { f.idempotent, f.canLookup, f.redelivered = false, true, true }), nil,
			verdict{lookup: true}},
		{"a row claimed first beyond the broker's memory looks up", with(fresh, func(f *facts) { f.idempotent, f.canLookup, f.beyondDedup = false, true, true }), nil,
			verdict{lookup: true}},
		{"a row an earlier attempt may have reached looks up", with(fresh, func(f *facts) { f.idempotent, f.canLookup, f.maybeAccepted = false, true, true }), nil,
			verdict{lookup: true}},
		{"a redelivery without lookups calls (the row says no attempt may have been taken)", with(fresh, func(f *facts) { f.idempotent, f.redelivered = false, true }), nil,
			verdict{call: true}},
		{"a lookup not due yet waits, spending nothing", with(fresh, func(f *facts) {
			f.idempotent, f.canLookup, f.stale, f.maybeAccepted, f.lookupWait = false, true, true, true, 4*time.Second
		}), nil,
			verdict{status: outbox.StatusQueued, action: nak, delay: 4 * time.Second, maybe: true, lookupPending: true, refund: true, heldBack: "lookup_wait"}},
		{"a lookup due after the longest nak waits parked", with(fresh, func(f *facts) {
			f.idempotent, f.canLookup, f.lookupPending, f.lookupWait = false, true, true, time.Minute
		}), nil,
			verdict{status: outbox.StatusQueued, action: ack, park: true, delay: time.Minute, lookupPending: true, refund: true, heldBack: "lookup_wait"}},
		{"a missed write's mark without lookups ends unknown, never calls", with(fresh, func(f *facts) { f.idempotent, f.lookupPending, f.maybeAccepted = false, true, true }), nil,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "ambiguous", letter: true}},
		{"an idempotent provider never looks up", with(fresh, func(f *facts) { f.canLookup, f.lookupPending, f.stale = true, true, true }), nil,
			verdict{call: true}},
		{"an unclassified outcome ends dead", fresh, &provider.Outcome{}, verdict{status: outbox.StatusDead, reason: "permanent", action: term, outcome: "permanent", letter: true}},

		// The recipient opted out: never dead (the user got nothing, but
		// by their own wish), the number to the list, no letter.
		{"an opted-out refusal ends suppressed, the number to the list", fresh, optedOut,
			verdict{status: outbox.StatusSuppressed, action: ack, outcome: "permanent", suppress: true}},
		{"an opted-out refusal after a lost answer ends unknown, the number to the list", with(fresh, func(f *facts) { f.maybeAccepted = true }), optedOut,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, outcome: "permanent", letter: true, suppress: true}},
		// A number on the list when claimed: never a call.
		{"a claim run again after the number was listed ends suppressed, no call", with(fresh, func(f *facts) { f.suppressed = true }), nil,
			verdict{status: outbox.StatusSuppressed, action: ack, refund: true}},
		{"a suppressed number's row an attempt may have reached looks up, never calls", with(fresh, func(f *facts) {
			f.suppressed, f.idempotent, f.canLookup, f.maybeAccepted = true, false, true, true
		}), nil, verdict{lookup: true}},
		{"the same at an idempotent provider that can be asked: looks up, never calls (the key's replay is a call)", with(fresh, func(f *facts) {
			f.suppressed, f.canLookup, f.stale = true, true, true
		}), nil, verdict{lookup: true}},
		{"the same at a provider that cannot be asked ends unknown, never calls", with(fresh, func(f *facts) { f.suppressed, f.stale = true, true }), nil,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "ambiguous", letter: true, refund: true}},
		{"the same, its lookup not due yet, waits", with(fresh, func(f *facts) {
			f.suppressed, f.idempotent, f.canLookup, f.lookupPending, f.lookupWait = true, false, true, true, 3*time.Second
		}), nil, verdict{status: outbox.StatusQueued, action: nak, delay: 3 * time.Second, lookupPending: true, refund: true, heldBack: "lookup_wait"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.f, tt.o, p)
			errText := got.errText
			got.errText = ""
			if got != tt.want {
				t.Fatalf("decide = %+v\nwant     %+v", got, tt.want)
			}
			switch {
			case got.status == outbox.StatusUnknown && !strings.Contains(errText, "provider") && !strings.Contains(errText, "outcome") && !strings.Contains(errText, "response"):
				t.Errorf("unknown without saying why: %q", errText)
			case got.status == outbox.StatusSent && errText != "":
				t.Errorf("sent with an error text %q", errText)
			case (got.status == outbox.StatusDead || got.status == outbox.StatusQueued) && errText == "":
				t.Errorf("%s without an error text", got.status)
			}
		})
	}
}

// A lookup's answer settles what an attempt without one left open.
func TestDecideLookup(t *testing.T) {
	t.Parallel()
	p := policy{backoff: 700 * time.Millisecond, maxNakDelay: 30 * time.Second, settle: 10 * time.Second}
	f := facts{canLookup: true, attempt: 3, maxAttempts: 8, maybeAccepted: true, lookupPending: true, lookupBudget: 3}
	failed := provider.LookupResult{Err: errors.New("lookup: http 500")}
	tests := []struct {
		name string
		f    facts
		r    provider.LookupResult
		want verdict
	}{
		{"none: never accepted, send now", f, provider.LookupResult{}, verdict{call: true, notAccepted: true}},
		{"one accepted: sent, with its id", f, provider.LookupResult{Found: []provider.Found{{Ref: "msg_1", Status: "accepted"}}},
			verdict{status: outbox.StatusSent, action: ack, outcome: "lookup", ref: "msg_1", refund: true}},
		{"one delivered: delivered", f, provider.LookupResult{Found: []provider.Found{{Ref: "msg_1", Status: "delivered"}}},
			verdict{status: outbox.StatusDelivered, action: ack, outcome: "lookup", ref: "msg_1", refund: true}},
		{"one undelivered: undelivered", f, provider.LookupResult{Found: []provider.Found{{Ref: "msg_1", Status: "undelivered"}}},
			verdict{status: outbox.StatusUndelivered, action: ack, outcome: "lookup", ref: "msg_1", refund: true}},
		{"several: sent more than once, unknown", f, provider.LookupResult{Found: []provider.Found{{Ref: "msg_1"}, {Ref: "msg_2"}}},
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "lookup", letter: true, refund: true}},
		{"none for a row older than the provider's lookup retention: unknown, never a call", func() facts { g := f; g.pastRetention = true; return g }(), provider.LookupResult{},
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "lookup", letter: true, refund: true}},
		{"failed: asked again later, no attempt spent", f, failed,
			verdict{status: outbox.StatusQueued, action: nak, delay: 10 * time.Second, maybe: true, outcome: "lookup", lookupPending: true, lookupFailed: true, refund: true}},
		{"failed on the last delivery: parked", func() facts { g := f; g.lastDelivery = true; return g }(), failed,
			verdict{status: outbox.StatusQueued, action: ack, park: true, delay: 10 * time.Second, maybe: true, outcome: "lookup", lookupPending: true, lookupFailed: true, refund: true}},
		{"failed with the budget spent: unknown", func() facts { g := f; g.lookups = 2; return g }(), failed,
			verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "lookup", letter: true, lookupFailed: true, refund: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideLookup(tt.f, tt.r, p)
			errText := got.errText
			got.errText = ""
			if got != tt.want {
				t.Fatalf("decideLookup = %+v\nwant           %+v", got, tt.want)
			}
			if (got.status == outbox.StatusUnknown || got.status == outbox.StatusQueued) && errText == "" {
				t.Errorf("%s without an error text", got.status)
			}
		})
	}
	// Too little of the lease left for the call: no call, nothing spent, a
	// lookup that was due and not made stays pending.
	doubt := facts{canLookup: true, attempt: 2, maxAttempts: 8, redelivered: true}
	if v := decideNoTime(doubt, false, p); v.call || v.status != outbox.StatusQueued || !v.refund || !v.lookupPending || v.heldBack != "no_time" {
		t.Errorf("decideNoTime before a lookup = %+v", v)
	}
	if v := decideNoTime(doubt, true, p); v.lookupPending {
		t.Errorf("decideNoTime after a lookup = %+v; the next delivery looks up again anyway", v)
	}
	// None with the budget spent: nothing was ever sent, so dead.
	g := f
	g.attempt = 9
	if v := decideAfterNone(g); v.status != outbox.StatusDead || v.call || !v.notAccepted || !v.letter {
		t.Errorf("decideAfterNone past the budget = %+v, want dead, no call, mark cleared", v)
	}
	if v := decideAfterNone(f); !v.call || !v.notAccepted {
		t.Errorf("decideAfterNone = %+v, want a call", v)
	}
	// None for a row whose number is on the suppression list: no earlier
	// attempt reached the provider, and none is made now.
	g = f
	g.suppressed = true
	if v := decideAfterNone(g); v.status != outbox.StatusSuppressed || v.call || !v.notAccepted || v.letter {
		t.Errorf("decideAfterNone of a suppressed number's row = %+v, want suppressed, no call, mark cleared", v)
	}
}

// An expired row is never called: one nothing marks as possibly taken ends
// expired; one an earlier attempt may have reached is looked up once the
// provider has had the settle time to show it (idempotent or not), or ends
// unknown where it cannot be asked, or where a lookup proves nothing (past
// the provider's retention); a lookup that finds nothing ends it expired.
func TestDecideExpired(t *testing.T) {
	t.Parallel()
	p := policy{backoff: 700 * time.Millisecond, maxNakDelay: 30 * time.Second, settle: 10 * time.Second}
	exp := facts{idempotent: true, attempt: 2, maxAttempts: 8, expired: true}
	with := func(f facts, edit func(*facts)) facts { edit(&f); return f }
	expired := verdict{status: outbox.StatusExpired, action: ack, outcome: "expired", refund: true}
	unknown := verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "ambiguous", letter: true, refund: true}
	settleWait := verdict{status: outbox.StatusQueued, action: nak, delay: 10 * time.Second, maybe: true, lookupPending: true, refund: true, heldBack: "lookup_wait"}
	for _, tt := range []struct {
		name string
		f    facts
		o    *provider.Outcome
		want verdict
	}{
		{"unmarked: expired, no call", exp, nil, expired},
		{"unmarked at a provider that cannot be asked: expired", with(exp, func(f *facts) { f.idempotent = false }), nil, expired},
		{"maybe taken, can be asked: waits the settle time first", with(exp, func(f *facts) { f.maybeAccepted, f.canLookup = true, true }), nil, settleWait},
		{"maybe taken, its lookup due: asks", with(exp, func(f *facts) { f.maybeAccepted, f.canLookup, f.lookupPending = true, true, true }), nil,
			verdict{lookup: true}},
		{"maybe taken, its lookup not due yet: waits", with(exp, func(f *facts) {
			f.maybeAccepted, f.canLookup, f.lookupPending, f.lookupWait = true, true, true, 3*time.Second
		}), nil, verdict{status: outbox.StatusQueued, action: nak, delay: 3 * time.Second, maybe: true, lookupPending: true, refund: true, heldBack: "lookup_wait"}},
		{"maybe taken, cannot be asked: unknown", with(exp, func(f *facts) { f.maybeAccepted = true }), nil, unknown},
		{"maybe taken, past the lookups' retention: unknown", with(exp, func(f *facts) { f.maybeAccepted, f.canLookup, f.pastRetention = true, true, true }), nil, unknown},
		{"a stale claim is a mark", with(exp, func(f *facts) { f.stale = true }), nil, unknown},
		{"an unaccounted redelivery is a mark", with(exp, func(f *facts) { f.redelivered = true }), nil, unknown},
		{"the client sent nothing: expired", with(exp, func(f *facts) { f.expired = false }), &provider.Outcome{Kind: provider.Expired, Reason: "expired"}, expired},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.f, tt.o, p)
			got.errText = ""
			if got != tt.want {
				t.Fatalf("decide = %+v\nwant     %+v", got, tt.want)
			}
		})
	}
	f := with(exp, func(f *facts) { f.maybeAccepted = false })
	if got := decideAfterNone(f); got.status != outbox.StatusExpired || !got.notAccepted || got.call {
		t.Errorf("after a lookup found nothing: %+v; want expired, not called", got)
	}
}
