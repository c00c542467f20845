package sender

import (
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/wire"
)

// A plan is what a sender does with one claimed row, step by step: which
// provider, whether to look up first and where, whether to move the row to
// another provider, whether to call, and the verdict it ends with. It does
// no I/O. Sender.attempt carries out each step the plan names and hands its
// outcome back to plan.next, which names the next; the verdicts themselves
// are decide's (decide.go). Keeping the sequence here, apart from the I/O,
// lets one table test walk every path a claim can take.

// stepKind is the kind of I/O a step asks for.
type stepKind uint8

const (
	// stepFinish: write the plan's verdict (plan.v); nothing else is done.
	stepFinish stepKind = iota
	// stepCircuit: read whether the row's provider's circuit takes calls
	// now (outcome.ok).
	stepCircuit
	// stepAlternative: find the first other provider whose circuit takes
	// calls now (outcome.alt; at -1 when none does).
	stepAlternative
	// stepToken: take a token of the shared rate for a request to provider
	// at, waiting no later than the last moment its call may start within
	// the lease (outcome.ok: taken in time).
	stepToken
	// stepRepin: name provider at in the row, moving it there from the
	// current one (outcome.ok: the write applied).
	stepRepin
	// stepLookElsewhere: ask provider at, not the row's, whether it has
	// the message (outcome.lookup).
	stepLookElsewhere
	// stepLookUp: ask the row's provider what became of the earlier
	// attempts (outcome.lookup).
	stepLookUp
	// stepCall: call provider at (outcome.call, outcome.notTaken).
	stepCall
)

func (k stepKind) String() string {
	switch k {
	case stepFinish:
		return "finish"
	case stepCircuit:
		return "circuit"
	case stepAlternative:
		return "alternative"
	case stepToken:
		return "token"
	case stepRepin:
		return "repin"
	case stepLookElsewhere:
		return "lookElsewhere"
	case stepLookUp:
		return "lookUp"
	case stepCall:
		return "call"
	}
	return "unknown"
}

// step is one thing the plan asks the sender to do.
type step struct {
	kind stepKind
	// at is the provider the step concerns: its place in the sender's
	// list of routes.
	at int
}

// peer is what a plan knows of one provider of the sender's list.
type peer struct {
	// at is the provider's place in the sender's list of routes; -1 for
	// none.
	at         int
	name       string
	idempotent bool
	canLookup  bool
	// timeout is the bound on one of its calls (Provider.Timeout).
	timeout time.Duration
}

// noPeer is the answer of a stepAlternative that found no provider.
var noPeer = peer{at: -1}

// outcome is what a step did, as the plan needs it.
type outcome struct {
	// now is when the step ended, by the local clock: the expiry and the
	// lease are judged against it.
	now time.Time
	// ok: the circuit takes calls (stepCircuit), the token came in time
	// (stepToken), the row was moved (stepRepin).
	ok bool
	// alt is the provider a stepAlternative found.
	alt peer
	// lookup is a lookup's answer, its messages already attributed.
	lookup provider.LookupResult
	// call is a call's classified answer; notTaken reports that it
	// certainly left the message untaken (notTaken), so that another
	// provider may be called.
	call     provider.Outcome
	notTaken bool
}

// phase is where a plan is: which step's outcome it waits for.
type phase uint8

const (
	phaseStart phase = iota
	phaseCircuit
	phaseAlternative
	phaseRepin
	phaseElsewhereToken
	phaseElsewhere
	phaseLookUp
	phaseToken
	phaseCall
	phaseNextAlternative
	phaseNextToken
	phaseNextRepin
	phaseCallNext
	phaseDone
)

// plan is one claim's walk. The fields up to phase are the claim's facts,
// set before the first next; the rest is the walk's state, read by the
// sender for the result once next returns stepFinish.
type plan struct {
	// unknown: the row names a provider this sender was not given.
	unknown bool
	f       facts
	pol     policy
	// cur is the provider the row is to be sent to; a move or a lookup
	// elsewhere that found the message changes it.
	cur peer
	// peers is every provider of the list, for a row that may be held by
	// one it does not name (several providers and facts.uncertain); nil
	// otherwise.
	peers []peer
	// failover: the sender has providers to move rows between.
	failover bool
	// expiresAt is the row's expiry (zero: never); deadline is when the
	// claim's lease ends by the local clock.
	expiresAt, deadline time.Time
	// wait is how long before the claim's lookups may be made (lookupWait)
	// and pastRetention whether the row is older than lookups see, for the
	// lookups at the other providers: facts holds them only when the row's
	// own provider can be asked, and the others are asked whatever it can
	// do.
	wait          time.Duration
	pastRetention bool

	phase phase
	// v is the verdict so far; once next returns stepFinish, the row's.
	v verdict
	// movable: the row may move to another provider (nothing says an
	// earlier attempt can have reached the one it names).
	movable bool
	// heldBack is why the row waits without a call, as decided before it
	// (verdict.heldBack); "" when it was called.
	heldBack string
	// lookedUp: a lookup's answer is the row's evidence.
	lookedUp bool
	// everywhere and everywhereSet are the row's lookup_everywhere mark:
	// written only when set.
	everywhere, everywhereSet bool
	// asked is the place in peers of the last provider asked elsewhere.
	asked int
	// alt is the provider a move goes to.
	alt peer
	// called: the provider was called and may have sent (a call the client
	// never sent for the expiry is not one); moved: the row moved after
	// its first provider did not take the call.
	called, moved bool
	// out is the last call's answer.
	out provider.Outcome
}

// next takes the outcome of the step it named last (for the first call, an
// outcome with only now set) and names the next step. After stepFinish,
// p.v is the verdict and next is not called again.
func (p *plan) next(o outcome) step {
	switch p.phase {
	case phaseStart:
		if p.unknown {
			p.v = decideUnknown(p.f, p.pol)
			return p.finish()
		}
		p.movable = p.failover && !p.f.doubtful()
		p.v = decide(p.f, nil, p.pol)
		// The row's lookup_everywhere mark: an uncertain claim keeps it set
		// (whatever it decides without asking every other provider: a wait
		// for the settle time, too little lease), and clears it only once
		// they have all answered.
		if p.failover && p.f.uncertain() {
			p.everywhere, p.everywhereSet = true, true
		}
		if p.v.call && p.movable {
			// A row that may move goes elsewhere when its provider's circuit
			// is open.
			return p.await(phaseCircuit, step{kind: stepCircuit, at: p.cur.at})
		}
		return p.elsewhere(o.now)
	case phaseCircuit:
		if o.ok {
			return p.elsewhere(o.now)
		}
		// Its circuit is open: the row goes to the next provider that takes
		// calls, named in the row before it is called there.
		return p.await(phaseAlternative, step{kind: stepAlternative, at: p.cur.at})
	case phaseAlternative:
		if o.alt.at < 0 {
			return p.elsewhere(o.now)
		}
		p.alt = o.alt
		return p.await(phaseRepin, step{kind: stepRepin, at: o.alt.at})
	case phaseRepin:
		if o.ok {
			p.moveTo(p.alt)
		}
		return p.elsewhere(o.now)
	case phaseElsewhereToken:
		if !o.ok {
			p.v = decideNoTime(p.f, false, p.pol)
			p.everywhere = true
			return p.lookUp(o.now)
		}
		return p.await(phaseElsewhere, step{kind: stepLookElsewhere, at: p.peers[p.asked].at})
	case phaseElsewhere:
		if lookupOf(o.lookup) == "none" {
			return p.askNext(p.asked+1, o.now)
		}
		p.v, p.lookedUp = decideLookup(p.f, o.lookup, p.pol), true
		if o.lookup.Err != nil {
			// Not answered: the next claim asks again, first.
			p.everywhere = true
			return p.lookUp(o.now)
		}
		// The provider that has the message is the row's; what it answered
		// settles the row (found, or sent more than once).
		p.cur, p.everywhere = p.peers[p.asked], false
		return p.lookUp(o.now)
	case phaseLookUp:
		p.v, p.lookedUp = decideLookup(p.f, o.lookup, p.pol), true
		if p.v.notAccepted {
			// No earlier attempt reached the provider: what follows is
			// decided as if none had.
			p.f.maybeAccepted = false
			p.v = decideAfterNone(p.f)
		}
		if p.v.call {
			// The lookup spent the claim's token: the call waits for
			// another, but not past the last moment it may start within the
			// lease.
			return p.await(phaseToken, step{kind: stepToken, at: p.cur.at})
		}
		return p.beforeCall(o.now, false)
	case phaseToken:
		// No token in time: as if the lease ran short.
		return p.beforeCall(o.now, !o.ok)
	case phaseCall:
		p.called, p.out = true, o.call
		if o.notTaken && p.movable {
			// Certainly not taken: the next provider that takes calls gets
			// the row, named in it first, if the lease leaves time and a
			// token comes in time.
			return p.await(phaseNextAlternative, step{kind: stepAlternative, at: p.cur.at})
		}
		return p.afterCall()
	case phaseNextAlternative:
		if o.alt.at < 0 || p.deadline.Sub(o.now) < o.alt.timeout {
			return p.afterCall()
		}
		p.alt = o.alt
		return p.await(phaseNextToken, step{kind: stepToken, at: o.alt.at})
	case phaseNextToken:
		if !o.ok {
			return p.afterCall()
		}
		return p.await(phaseNextRepin, step{kind: stepRepin, at: p.alt.at})
	case phaseNextRepin:
		if !o.ok {
			return p.afterCall()
		}
		p.moveTo(p.alt)
		p.moved = true
		return p.await(phaseCallNext, step{kind: stepCall, at: p.cur.at})
	case phaseCallNext:
		p.out = o.call
		return p.afterCall()
	}
	return p.finish()
}

func (p *plan) await(ph phase, s step) step {
	p.phase = ph
	return s
}

func (p *plan) finish() step {
	p.phase = phaseDone
	return step{kind: stepFinish}
}

// moveTo makes to the row's provider for what follows.
func (p *plan) moveTo(to peer) {
	p.cur = to
	p.f.idempotent, p.f.canLookup = to.idempotent, to.canLookup
}

// elsewhere begins the lookups at every other provider, for a row about to
// be called or looked up whose records may have lost an attempt, with
// several providers: what a failover lost may be the claim that named the
// provider, or a move to another, so any of them may hold the row. Every
// other provider is asked before this one is called or asked; one that
// cannot be asked leaves the row unknown.
//
// A provider that cannot be asked (no lookups, or the row is older than the
// lookups' retention, so that "none" proves nothing) ends the row unknown
// when the row's records have certainly lost an attempt (a redelivery whose
// previous claim the row does not show): caution wins. On the weaker doubts
// (a stale claim, a republication, a row past the dedup window), which a
// sender outage or a parked retry also raise, it is passed over, as a
// single provider that cannot be asked would be called.
func (p *plan) elsewhere(now time.Time) step {
	if !(p.v.call || p.v.lookup) || !p.failover || !p.f.uncertain() {
		return p.lookUp(now)
	}
	askable := 0
	for _, y := range p.peers {
		if y.at == p.cur.at {
			continue
		}
		if y.canLookup && !p.pastRetention {
			askable++
			continue
		}
		if p.f.redelivered {
			why := "cannot be asked"
			if p.pastRetention {
				why = "cannot tell after its lookup retention"
			}
			p.v = verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous, action: term, maybe: true, outcome: "ambiguous", letter: true,
				errText:   "an earlier attempt was lost with its records, and provider " + y.name + " of SMS_PROVIDERS, which may have the message, " + why,
				elsewhere: y.name}
			p.everywhere = false
			return p.lookUp(now)
		}
	}
	if askable == 0 {
		p.everywhere = false
		return p.lookUp(now)
	}
	if p.wait > 0 {
		// A request made just before the lease ran out may not show yet.
		f := p.f
		f.lookupWait = p.wait
		p.v = deferLookup(f, p.pol)
		return p.lookUp(now)
	}
	return p.askNext(0, now)
}

// askNext asks the first provider from peers[from] on that can be asked;
// when every one has answered none, the row is theirs to none, and what
// was decided before goes on.
func (p *plan) askNext(from int, now time.Time) step {
	for i := from; i < len(p.peers); i++ {
		if y := p.peers[i]; y.at != p.cur.at && y.canLookup && !p.pastRetention {
			// Each lookup takes a token of its own: the claim's is the
			// call's.
			p.asked = i
			return p.await(phaseElsewhereToken, step{kind: stepToken, at: y.at})
		}
	}
	p.everywhere = false
	return p.lookUp(now)
}

// lookUp asks the row's provider what became of the earlier attempts when
// the verdict says so. Every attempt carried the same reference, so one
// lookup covers them all.
func (p *plan) lookUp(now time.Time) step {
	if p.v.lookup {
		return p.await(phaseLookUp, step{kind: stepLookUp, at: p.cur.at})
	}
	return p.beforeCall(now, false)
}

// beforeCall checks a call against the clock at now: the expiry may have
// come while the claim looked the row up or waited for a token, and a slow
// claim or lookup may have left too little of the lease for the call (short:
// no token came in time). Then the call is made, or the row finished.
func (p *plan) beforeCall(now time.Time, short bool) step {
	if p.v.call && expiredAt(p.expiresAt, now) {
		// No call starts at or after the expiry.
		p.f.expired = true
		notAccepted := p.v.notAccepted
		if notAccepted {
			p.f.maybeAccepted = false
			p.v = decideAfterNone(p.f)
		} else {
			p.v = decideExpired(p.f, p.pol)
			if p.v.lookup {
				// Asked already, or no time to ask now: the next claim asks.
				p.v = deferLookup(p.f, p.pol)
			}
		}
		p.v.notAccepted = notAccepted
	}
	if p.v.call && (short || p.deadline.Sub(now) < p.cur.timeout) {
		// A call that could outlive the lease is not made, so that no
		// attempt ever overlaps the next claim's.
		notAccepted := p.v.notAccepted
		p.v = decideNoTime(p.f, p.lookedUp, p.pol)
		p.v.notAccepted = notAccepted
	}
	p.heldBack = p.v.heldBack
	if !p.v.call {
		return p.finish()
	}
	return p.await(phaseCall, step{kind: stepCall, at: p.cur.at})
}

// afterCall decides on the last call's answer.
func (p *plan) afterCall() step {
	if p.out.Kind == provider.Expired {
		// The client sent nothing: the expiry came first.
		p.called = false
	}
	notAccepted := p.v.notAccepted
	p.v = decide(p.f, &p.out, p.pol)
	p.v.notAccepted = notAccepted
	if p.moved {
		// The first provider was called (and did not take it): the attempt
		// was spent, whatever the second answered (a 429 would give it
		// back).
		p.v.refund = false
	}
	return p.finish()
}
