package sender

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
)

// The plan is every path a claim can take through a sender: each case
// walks it step by step, giving each step the outcome its I/O would have
// had, and checks the steps named on the way and the verdict at the end.
func TestPlan(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	pol := policy{backoff: 700 * time.Millisecond, maxNakDelay: 30 * time.Second, settle: 10 * time.Second}
	// a honours keys and cannot be asked; b honours keys and can be asked;
	// asker can be asked and does not honour keys; mute can do neither.
	a := peer{at: 0, name: "a", idempotent: true, timeout: 5 * time.Second}
	b := peer{at: 1, name: "b", idempotent: true, canLookup: true, timeout: 5 * time.Second}
	asker := peer{at: 0, name: "asker", canLookup: true, timeout: 5 * time.Second}
	mute := peer{at: 1, name: "mute", timeout: 5 * time.Second}

	// one is a fresh claim at a sender with one provider; two the same with
	// a second provider to move to; uncertain a claim whose records may
	// have lost an attempt (a republication), with two providers.
	one := plan{f: facts{idempotent: true, attempt: 1, maxAttempts: 8, lookupBudget: 3}, pol: pol, cur: a, deadline: t0.Add(time.Minute)}
	two := one
	two.failover = true
	uncertain := two
	uncertain.f.republished, uncertain.peers = true, []peer{a, b}
	// looking is a claim whose earlier attempt may have reached a provider
	// that can be asked and does not honour keys: it looks up first.
	looking := one
	looking.cur = asker
	looking.f.idempotent, looking.f.canLookup, looking.f.lookupPending, looking.f.maybeAccepted, looking.f.attempt = false, true, true, true, 2
	with := func(p plan, edit func(*plan)) plan { edit(&p); return p }

	sent := provider.Outcome{Kind: provider.Sent, Ref: "msg_1", HTTPStatus: 201}
	refused := provider.Outcome{Kind: provider.Retry, Reason: "connection refused"}
	limited := provider.Outcome{Kind: provider.Retry, HTTPStatus: 429, After: 2 * time.Second}
	none := provider.LookupResult{}
	found := provider.LookupResult{Found: []provider.Found{{Ref: "msg_9", Status: "accepted"}}}
	failed := provider.LookupResult{Err: errors.New("lookup: http 500")}
	yes, no := ptr(true), ptr(false)

	type exchange struct {
		want step    // the step the plan names
		give outcome // what doing it came to; now is t0 when zero
	}
	do := func(k stepKind, at int, give outcome) exchange { return exchange{step{kind: k, at: at}, give} }

	sentVerdict := verdict{status: outbox.StatusSent, action: ack, outcome: "sent"}
	noTime := verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, refund: true, heldBack: "no_time"}
	tests := []struct {
		name string
		p    plan
		walk []exchange
		want verdict
		// the walk's end: whether the provider was called, whether the row
		// moved after a call, the provider it ends at, its
		// lookup_everywhere mark (nil: not written) and whether a lookup's
		// answer is its evidence.
		called, moved, lookedUp bool
		at                      int
		everywhere              *bool
	}{
		{name: "provider unknown: waits for a sender that has it, nothing spent",
			p:    plan{unknown: true, pol: pol},
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 30 * time.Second, refund: true}},
		{name: "provider unknown on the last delivery: parked",
			p:    plan{unknown: true, pol: pol, f: facts{lastDelivery: true}},
			want: verdict{status: outbox.StatusQueued, action: ack, park: true, delay: 30 * time.Second, refund: true}},
		{name: "fresh claim: called, sent",
			p:    one,
			walk: []exchange{do(stepCall, 0, outcome{call: sent})},
			want: sentVerdict, called: true},
		{name: "expired before the call: expired, no call",
			p:    with(one, func(p *plan) { p.f.expired = true }),
			want: verdict{status: outbox.StatusExpired, action: ack, outcome: "expired", refund: true}},
		{name: "the expiry comes between the claim's facts and the call: expired, no call",
			p:    with(one, func(p *plan) { p.expiresAt = t0 }),
			want: verdict{status: outbox.StatusExpired, action: ack, outcome: "expired", refund: true}},
		{name: "the client sent nothing for the expiry: not called",
			p:    one,
			walk: []exchange{do(stepCall, 0, outcome{call: provider.Outcome{Kind: provider.Expired}})},
			want: verdict{status: outbox.StatusExpired, action: ack, outcome: "expired", refund: true}},
		{name: "lookup, none, then a token, then the call",
			p: looking,
			walk: []exchange{
				do(stepLookUp, 0, outcome{lookup: none}),
				do(stepToken, 0, outcome{ok: true}),
				do(stepCall, 0, outcome{call: sent}),
			},
			want: verdict{status: outbox.StatusSent, action: ack, outcome: "sent", notAccepted: true}, called: true, lookedUp: true},
		{name: "lookup found: settled with its id, no call",
			p:    looking,
			walk: []exchange{do(stepLookUp, 0, outcome{lookup: found})},
			want: verdict{status: outbox.StatusSent, action: ack, outcome: "lookup", ref: "msg_9", refund: true}, lookedUp: true},
		{name: "lookup failed: asked again later",
			p:        looking,
			walk:     []exchange{do(stepLookUp, 0, outcome{lookup: failed})},
			want:     verdict{status: outbox.StatusQueued, action: nak, delay: 10 * time.Second, maybe: true, outcome: "lookup", lookupPending: true, lookupFailed: true, refund: true},
			lookedUp: true},
		{name: "lookup none with the budget spent: dead, no call",
			p:    with(looking, func(p *plan) { p.f.attempt = 9 }),
			walk: []exchange{do(stepLookUp, 0, outcome{lookup: none})},
			want: verdict{status: outbox.StatusDead, reason: "max_attempts", action: term, outcome: "max_attempts", letter: true, notAccepted: true}, lookedUp: true},
		{name: "the expiry comes during the lookup: expired after none, no call",
			p: with(looking, func(p *plan) { p.expiresAt = t0.Add(10 * time.Second) }),
			walk: []exchange{
				do(stepLookUp, 0, outcome{lookup: none, now: t0.Add(10 * time.Second)}),
				do(stepToken, 0, outcome{ok: true, now: t0.Add(10 * time.Second)}),
			},
			want: verdict{status: outbox.StatusExpired, action: ack, outcome: "expired", refund: true, notAccepted: true}, lookedUp: true},
		{name: "the expiry comes during the token wait: expired after none, no call",
			p: with(looking, func(p *plan) { p.expiresAt = t0.Add(10 * time.Second) }),
			walk: []exchange{
				do(stepLookUp, 0, outcome{lookup: none, now: t0.Add(time.Second)}),
				do(stepToken, 0, outcome{ok: true, now: t0.Add(10 * time.Second)}),
			},
			want: verdict{status: outbox.StatusExpired, action: ack, outcome: "expired", refund: true, notAccepted: true}, lookedUp: true},
		{name: "no token in time after the lookup: no_time, the lookup not owed again",
			p: looking,
			walk: []exchange{
				do(stepLookUp, 0, outcome{lookup: none}),
				do(stepToken, 0, outcome{ok: false}),
			},
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, refund: true, heldBack: "no_time", notAccepted: true}, lookedUp: true},
		{name: "too little lease for the call: no_time, no call",
			p:    with(one, func(p *plan) { p.deadline = t0.Add(4 * time.Second) }),
			want: noTime},
		{name: "the lookup took the lease: no_time after none",
			p:    looking,
			walk: []exchange{do(stepLookUp, 0, outcome{lookup: none, now: t0.Add(56 * time.Second)}), do(stepToken, 0, outcome{ok: true, now: t0.Add(56 * time.Second)})},
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, refund: true, heldBack: "no_time", notAccepted: true}, lookedUp: true},
		{name: "a lookup not due yet: waits, spending nothing",
			p:    with(looking, func(p *plan) { p.f.lookupWait = 4 * time.Second }),
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 4 * time.Second, maybe: true, lookupPending: true, refund: true, heldBack: "lookup_wait"}},

		{name: "circuit open: moved to the alternative before the call, called there",
			p: two,
			walk: []exchange{
				do(stepCircuit, 0, outcome{ok: false}),
				do(stepAlternative, 0, outcome{alt: b}),
				do(stepRepin, 1, outcome{ok: true}),
				do(stepCall, 1, outcome{call: sent}),
			},
			want: sentVerdict, called: true, at: 1},
		{name: "circuit open, no alternative: called where it is",
			p: two,
			walk: []exchange{
				do(stepCircuit, 0, outcome{ok: false}),
				do(stepAlternative, 0, outcome{alt: noPeer}),
				do(stepCall, 0, outcome{call: sent}),
			},
			want: sentVerdict, called: true},
		{name: "circuit open, the move not written: called where it is",
			p: two,
			walk: []exchange{
				do(stepCircuit, 0, outcome{ok: false}),
				do(stepAlternative, 0, outcome{alt: b}),
				do(stepRepin, 1, outcome{ok: false}),
				do(stepCall, 0, outcome{call: sent}),
			},
			want: sentVerdict, called: true},
		{name: "a row an earlier attempt may have reached never moves",
			p:    with(two, func(p *plan) { p.f.maybeAccepted = true }),
			walk: []exchange{do(stepCall, 0, outcome{call: refused, notTaken: true})},
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, outcome: "retry"}, called: true},
		{name: "not taken: moved to the next provider and called again, the attempt spent",
			p: two,
			walk: []exchange{
				do(stepCircuit, 0, outcome{ok: true}),
				do(stepCall, 0, outcome{call: refused, notTaken: true}),
				do(stepAlternative, 0, outcome{alt: b}),
				do(stepToken, 1, outcome{ok: true}),
				do(stepRepin, 1, outcome{ok: true}),
				do(stepCall, 1, outcome{call: limited}),
			},
			want:   verdict{status: outbox.StatusQueued, action: nak, delay: 2 * time.Second, outcome: "rate_limited", pause: true},
			called: true, moved: true, at: 1},
		{name: "not taken, too little lease for the next provider: the first answer stands",
			p: two,
			walk: []exchange{
				do(stepCircuit, 0, outcome{ok: true}),
				do(stepCall, 0, outcome{call: refused, notTaken: true}),
				do(stepAlternative, 0, outcome{alt: b, now: t0.Add(56 * time.Second)}),
			},
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, outcome: "retry"}, called: true},
		{name: "not taken, no token in time for the next provider: the first answer stands",
			p: two,
			walk: []exchange{
				do(stepCircuit, 0, outcome{ok: true}),
				do(stepCall, 0, outcome{call: refused, notTaken: true}),
				do(stepAlternative, 0, outcome{alt: b}),
				do(stepToken, 1, outcome{ok: false}),
			},
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 700 * time.Millisecond, outcome: "retry"}, called: true},

		{name: "failover with uncertain facts: every other provider asked first, then the call",
			p: uncertain,
			walk: []exchange{
				do(stepToken, 1, outcome{ok: true}),
				do(stepLookElsewhere, 1, outcome{lookup: none}),
				do(stepCall, 0, outcome{call: sent}),
			},
			want: sentVerdict, called: true, everywhere: no},
		{name: "failover with uncertain facts: another provider has the message, settled there",
			p: uncertain,
			walk: []exchange{
				do(stepToken, 1, outcome{ok: true}),
				do(stepLookElsewhere, 1, outcome{lookup: found}),
			},
			want: verdict{status: outbox.StatusSent, action: ack, outcome: "lookup", ref: "msg_9", refund: true}, at: 1, everywhere: no, lookedUp: true},
		{name: "failover with uncertain facts: a lookup elsewhere failed, asked again first next time",
			p: uncertain,
			walk: []exchange{
				do(stepToken, 1, outcome{ok: true}),
				do(stepLookElsewhere, 1, outcome{lookup: failed}),
			},
			want:     verdict{status: outbox.StatusQueued, action: nak, delay: 10 * time.Second, maybe: true, outcome: "lookup", lookupPending: true, lookupFailed: true, refund: true},
			lookedUp: true, everywhere: yes},
		{name: "failover with uncertain facts: no token for the lookup elsewhere, no_time",
			p:          uncertain,
			walk:       []exchange{do(stepToken, 1, outcome{ok: false})},
			want:       noTime,
			everywhere: yes},
		{name: "failover with uncertain facts: the settle time not over, waits",
			p:    with(uncertain, func(p *plan) { p.wait = 4 * time.Second }),
			want: verdict{status: outbox.StatusQueued, action: nak, delay: 4 * time.Second, lookupPending: true, refund: true, heldBack: "lookup_wait"}, everywhere: yes},
		{name: "failover, a lost claim, a provider that cannot be asked: unknown, naming it",
			p:    with(uncertain, func(p *plan) { p.f.redelivered, p.peers = true, []peer{a, mute} }),
			want: verdict{status: outbox.StatusUnknown, reason: "ambiguous", action: term, maybe: true, outcome: "ambiguous", letter: true, elsewhere: "mute"}, everywhere: no},
		{name: "failover, a republication, a provider that cannot be asked: passed over, called",
			p:    with(uncertain, func(p *plan) { p.peers = []peer{a, mute} }),
			walk: []exchange{do(stepCall, 0, outcome{call: sent})},
			want: sentVerdict, called: true, everywhere: no},
		{name: "failover, uncertain, its own lookup after none elsewhere",
			p: with(uncertain, func(p *plan) {
				p.cur, p.f.idempotent, p.f.canLookup, p.peers = asker, false, true, []peer{asker, b}
			}),
			walk: []exchange{
				do(stepToken, 1, outcome{ok: true}),
				do(stepLookElsewhere, 1, outcome{lookup: none}),
				do(stepLookUp, 0, outcome{lookup: none}),
				do(stepToken, 0, outcome{ok: true}),
				do(stepCall, 0, outcome{call: sent}),
			},
			want: verdict{status: outbox.StatusSent, action: ack, outcome: "sent", notAccepted: true}, called: true, lookedUp: true, everywhere: no},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			var path []string
			st := p.next(outcome{now: t0})
			for i, x := range tt.walk {
				path = append(path, st.kind.String())
				if st != x.want {
					t.Fatalf("step %d (after %v) = %v at %d, want %v at %d", i, path[:i], st.kind, st.at, x.want.kind, x.want.at)
				}
				if x.give.now.IsZero() {
					x.give.now = t0
				}
				st = p.next(x.give)
			}
			if st.kind != stepFinish {
				t.Fatalf("after %v: %v at %d, want finish", path, st.kind, st.at)
			}
			got := p.v
			errText := got.errText
			got.errText = ""
			if got != tt.want {
				t.Fatalf("verdict = %+v\nwant      %+v", got, tt.want)
			}
			if got.elsewhere != "" && !strings.Contains(errText, got.elsewhere) {
				t.Errorf("the verdict names %q elsewhere, its text does not: %q", got.elsewhere, errText)
			}
			if p.called != tt.called || p.moved != tt.moved || p.lookedUp != tt.lookedUp || p.cur.at != tt.at {
				t.Errorf("called %v, moved %v, looked up %v, at %d; want %v, %v, %v, %d", p.called, p.moved, p.lookedUp, p.cur.at, tt.called, tt.moved, tt.lookedUp, tt.at)
			}
			switch {
			case tt.everywhere == nil && p.everywhereSet:
				t.Errorf("lookup_everywhere written %v, want not written", p.everywhere)
			case tt.everywhere != nil && (!p.everywhereSet || p.everywhere != *tt.everywhere):
				t.Errorf("lookup_everywhere written %v (%v), want %v", p.everywhere, p.everywhereSet, *tt.everywhere)
			}
			if p.called && p.heldBack != "" {
				t.Errorf("called, and held back %q", p.heldBack)
			}
		})
	}
}
