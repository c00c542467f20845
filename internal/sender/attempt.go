package sender

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/tracing"
	"github.com/sendonce/sendonce/internal/wire"
)

// result is one decided attempt on its way to the status writer.
type result struct {
	held
	row       outbox.Result // Status "" writes nothing
	action    action
	delay     time.Duration // for nak
	createdAt time.Time
	attempts  []outbox.Attempt // the attempts-log records: a lookup, a call
	// letter is published once the row's dead or unknown status is written.
	letter *deadletter.Letter
}

// attempt makes one provider attempt for a claimed row, if the decision
// before the call allows it, and hands the verdict to the status writer; it
// reports whether it made a provider request (a lookup or a call), which
// spent the token the claim loop took for it. A lookup and the call after
// it are two requests: the call takes a token of its own first. The
// decisions are decide's; this only does the I/O around them.
//
// deadline is when the claim's lease ends by the local clock, counted from
// before the claim was sent (so never later than the lease the database
// stamped): the lookup and the call are bounded by it, and a call that
// could outlive it is not made, so that no attempt ever overlaps the next
// claim's.
func (s *Sender) attempt(ctx context.Context, h held, c outbox.Claim, deadline time.Time, results chan<- result) bool {
	// The row's attributes are formatted only for a line that is written: a
	// logger made With them for every attempt formatted them eagerly, 3-6 us
	// of CPU per message in BenchmarkSenderRun's profile.
	// A traced message's lookup and call are spans of its trace, and its
	// lines carry the trace's id.
	ctx = h.traced(ctx)
	logAt := func(level slog.Level, msg string, args ...any) {
		if s.log.Enabled(ctx, level) {
			head := []any{"outbox_id", c.ID.String(), "attempt", c.Attempt}
			if id := tracing.TraceID(ctx); id != "" {
				head = append(head, "trace_id", id)
			}
			s.log.Log(ctx, level, msg, append(head, args...)...)
		}
	}
	r := s.route(c.Provider)
	if r == nil {
		// A provider this sender was not given (a rolling change of
		// SMS_PROVIDERS): the row may be that provider's, so it waits for a
		// sender that has it, and is never sent elsewhere.
		s.metrics.heldBack.WithLabelValues("provider_unknown").Inc()
		logAt(slog.LevelWarn, "row belongs to a provider this sender does not have; left for one that has it", "provider", c.Provider)
		v := verdict{status: outbox.StatusQueued, action: nak, delay: max(s.cfg.MaxNakDelay, time.Second), refund: true,
			errText: "the row's provider is not among this sender's SMS_PROVIDERS; waiting for a sender that has it"}
		if s.lastDelivery(h.md) {
			v.action, v.park = ack, true
		}
		s.calling.Add(-1)
		results <- result{held: h, createdAt: c.CreatedAt, action: v.action, delay: v.delay, row: outbox.Result{
			ID: c.ID, Status: v.status, Error: v.errText, RetryIn: v.delay, Park: v.park, Token: c.Token,
			MaybeAccepted: c.MaybeAccepted, LookupPending: c.LookupPending, Refund: true, Attempt: c.Attempt, Gen: c.Gen}}
		return false
	}
	p := r.Provider
	f := facts{
		stale: c.Result == outbox.ClaimedStale, idempotent: p.Idempotent(),
		attempt: c.Attempt, maxAttempts: c.MaxAttempts, maybeAccepted: c.MaybeAccepted,
		lastDelivery: s.lastDelivery(h.md), canLookup: p.CanLookup(),
		lookupPending: c.LookupPending, lookups: c.Lookups, lookupBudget: s.cfg.LookupBudget, republished: c.Gen > 0,
		redelivered: unaccounted(h.md, c.PrevDelivery, c.HandedBack), everywhere: c.LookupEverywhere,
		expired: expiredAt(c.ExpiresAt, time.Now()), suppressed: c.SuppressedBy != "",
	}
	pol := policy{backoff: Backoff(c.Attempt, s.cfg.RetryBase, s.cfg.RetryCap), maxNakDelay: s.cfg.MaxNakDelay, settle: s.cfg.LookupSettle}
	if f.looksUp() || s.failover() {
		f.beyondDedup = c.Attempt == 1 && c.Gen == 0 && s.horizon.beyond(c.Age, c.CreatedAt)
	}
	if f.canLookup {
		// (An expired row is looked up at a provider that honours keys
		// too: it may not be called again.)
		f.lookupWait = lookupWait(c, pol.settle)
		f.pastRetention = s.cfg.LookupRetention > 0 && c.Age > s.cfg.LookupRetention
	}
	// A row may move to another provider only while nothing says an
	// earlier attempt can have reached this one: the same doubts that make
	// a provider without idempotency look a row up first.
	movable := s.failover() && !f.doubtful()
	res := result{held: h, createdAt: c.CreatedAt}
	v := decide(f, nil, pol)
	// The lookup and the call run to their own timeouts even during
	// shutdown (abandoning them would only leave the outcome unknown), but
	// never past the claim's lease.
	leased, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	if v.call && movable && !r.br.Ready() {
		// Its circuit is open: the row goes to the next provider that
		// takes calls, named in the row before it is called there.
		if alt := s.alternative(r); alt != nil && s.repin(leased, c, r, alt) {
			r, p = alt, alt.Provider
			f.idempotent, f.canLookup = p.Idempotent(), p.CanLookup()
		}
	}
	var lookup *outbox.Evidence
	// The row's lookup_everywhere mark: an uncertain claim keeps it set
	// (whatever it decides without asking every other provider: a wait for
	// the settle time, too little lease), and clears it only once they have
	// all answered.
	var everywhere *bool
	if s.failover() && f.uncertain() {
		everywhere = ptr(true)
	}
	if (v.call || v.lookup) && s.failover() && f.uncertain() {
		// With several providers, a row whose earlier attempt may be lost
		// with its records (a sender that died mid-call, a redelivery whose
		// claim the row does not show, a republication, a row older than
		// the dedup window) may be held by any of them: what a failover
		// lost may be the claim that named the provider, or a move to
		// another. Every other provider is asked before this one is called
		// or asked; one that cannot be asked leaves the row unknown.
		var found *route
		v, found, lookup, everywhere = s.askElsewhere(leased, c, r, v, f, pol, deadline, &res)
		if found != nil {
			r, p = found, found.Provider
		}
	}
	if v.lookup {
		// Ask the provider what became of the earlier attempts. Every
		// attempt carried the same reference, so one lookup covers them all.
		started := time.Now()
		q := provider.LookupQuery{Reference: c.ID.String(), To: c.To, Body: c.Body, Since: c.CreatedAt}
		lr := p.Lookup(leased, q)
		if lr.Err == nil && len(lr.Found) > 0 && p.LookupByContent() {
			lr = s.attributeFound(leased, c, p, q, lr)
		}
		v = decideLookup(f, lr, pol)
		result := lookupOf(lr)
		s.metrics.lookups.WithLabelValues(result).Inc()
		logAt(slog.LevelInfo, "provider lookup", "result", result, "found", len(lr.Found), "latency", lr.Latency.String(), "err", lr.Err)
		lookup = &outbox.Evidence{Kind: "lookup", Result: result, ProviderRef: v.ref, Detail: lookupDetail(lr),
			ReceivedAt: time.Now(), Source: "sender"}
		res.attempts = append(res.attempts, outbox.Attempt{
			OutboxID: c.ID, Number: c.Attempt, StartedAt: started, Latency: lr.Latency, Outcome: "lookup",
			Error: lookup.Detail, Sender: s.cfg.Name, Provider: r.Name,
		})
		if v.notAccepted {
			// No earlier attempt reached the provider: what follows is
			// decided as if none had.
			f.maybeAccepted = false
			v = decideAfterNone(f)
		}
	}
	if v.call && lookup != nil && s.cfg.Flow != nil {
		// The lookup spent the claim's token: the call waits for another,
		// but not past the last moment it may start within the lease.
		wctx, cancel := context.WithDeadline(leased, deadline.Add(-p.Timeout()))
		if err := s.cfg.Flow.Wait(wctx); err != nil {
			deadline = time.Now() // no token in time: as if the lease ran short
		}
		cancel()
	}
	if v.call && expiredAt(c.ExpiresAt, time.Now()) {
		// The expiry came while the claim looked the row up or waited for
		// a token: no call starts at or after it.
		f.expired = true
		notAccepted := v.notAccepted
		if notAccepted {
			f.maybeAccepted = false
			v = decideAfterNone(f)
		} else {
			v = decideExpired(f, pol)
			if v.lookup {
				// Asked already, or no time to ask now: the next claim asks.
				v = deferLookup(f, pol)
			}
		}
		v.notAccepted = notAccepted
	}
	if v.call && time.Until(deadline) < p.Timeout() {
		// A slow claim or lookup left too little of the lease for the call.
		notAccepted := v.notAccepted
		v = decideNoTime(f, lookup != nil, pol)
		v.notAccepted = notAccepted
	}
	if v.heldBack != "" {
		s.metrics.heldBack.WithLabelValues(v.heldBack).Inc()
		logAt(slog.LevelDebug, "attempt held back", "why", v.heldBack, "retry_in", v.delay.String())
	}
	started := time.Now()
	var out provider.Outcome
	called, moved := v.call, false
	if called {
		out = s.call(leased, r, c)
		if notTaken(p, out) && movable {
			// Certainly not taken: the next provider that takes calls gets
			// the row, named in it first, if the lease leaves time and a
			// token comes in time.
			if alt := s.alternative(r); alt != nil && time.Until(deadline) >= alt.Provider.Timeout() && s.flowToken(leased, deadline, alt) &&
				s.repin(leased, c, r, alt) {
				logAt(slog.LevelInfo, "provider did not take the message; moved to the next", "from", r.Name, "to", alt.Name,
					"http_status", out.HTTPStatus, "reason", out.Reason)
				res.attempts = append(res.attempts, outbox.Attempt{
					OutboxID: c.ID, Number: c.Attempt, StartedAt: started, Latency: out.Latency, Outcome: "retry",
					HTTPStatus: out.HTTPStatus, ProviderCode: out.Code, Sender: s.cfg.Name, Provider: r.Name,
					Error: "not taken, moved to " + alt.Name + ": " + out.Error(),
				})
				r, p, moved = alt, alt.Provider, true
				f.idempotent, f.canLookup = p.Idempotent(), p.CanLookup()
				started = time.Now()
				out = s.call(leased, r, c)
			}
		}
		if out.Kind == provider.Expired {
			// The client sent nothing: the expiry came first.
			called = false
		} else {
			s.metrics.providerSeconds.Observe(out.Latency.Seconds())
		}
		logAt(slog.LevelDebug, "provider attempt", "outcome", out.Kind.String(), "http_status", out.HTTPStatus,
			"provider_code", out.Code, "latency", out.Latency.String())
		if out.Kind == provider.Sent {
			crashpoint.Hit(crashpoint.SenderAfterAccept)
		}
		notAccepted := v.notAccepted
		v = decide(f, &out, pol)
		v.notAccepted = notAccepted
		if moved {
			// The first provider was called (and did not take it): the
			// attempt was spent, whatever the second answered (a 429
			// would give it back).
			v.refund = false
		}
	}
	if v.pause && s.cfg.Flow != nil {
		s.cfg.Flow.Pause(ctx, out.After)
	}
	if v.outcome != "lookup" {
		s.metrics.count(called, v.outcome)
	}
	if v.status == outbox.StatusSuppressed {
		source := c.SuppressedBy
		if v.suppress {
			source = outbox.SourceRefusal
		}
		s.metrics.suppressedRow(source, called)
	}
	if v.suppress {
		logAt(slog.LevelInfo, "the provider refused the message: the recipient opted out; the number goes on the suppression list",
			"provider", r.Name, "http_status", out.HTTPStatus, "provider_code", out.Code, "status", string(v.status))
	}
	switch {
	case v.letter && v.status == outbox.StatusUnknown:
		logAt(slog.LevelWarn, "outcome unknown; not retried", "reason", v.reason, "http_status", out.HTTPStatus)
	case v.letter:
		logAt(slog.LevelInfo, "message will not be sent", "status", string(v.status), "reason", v.reason,
			"http_status", out.HTTPStatus, "provider_code", out.Code)
	case v.park:
		logAt(slog.LevelDebug, "retry parked in Postgres", "retry_in", v.delay.String())
	}

	res.action, res.delay = v.action, v.delay
	res.row = outbox.Result{
		ID: c.ID, Status: v.status, Error: v.errText, Reason: v.reason, RetryIn: v.delay, Park: v.park,
		Token: c.Token, MaybeAccepted: v.maybe, Refund: v.refund, LookupPending: v.lookupPending, Attempt: c.Attempt, Gen: c.Gen,
		LookupFailed: v.lookupFailed, NotAccepted: v.notAccepted, Lookup: lookup, Provider: resultProvider(r, called, lookup), LookupEverywhere: everywhere,
	}
	switch {
	case called && v.status == outbox.StatusSent:
		res.row.ProviderRef = out.Ref
	case !called:
		res.row.ProviderRef = v.ref
	}
	if v.suppress {
		res.row.Suppress = &outbox.Suppression{Source: outbox.SourceRefusal, Provider: r.Name, Reason: fmt.Sprintf("code %d", out.Code)}
	}
	// A first attempt that was sent, of a row never replayed or republished
	// (generation 0), is described by its row (attempt_count 1,
	// provider_ref, sent_at): the log keeps what a row cannot describe,
	// which spares every message sent at once an insert and three index
	// entries. outbox.Attempts shows it from the row. After a replay the
	// count starts again beside the older generation's records, so the
	// row alone could not tell which attempt 1 it describes.
	firstSent := v.outcome == "sent" && c.Attempt == 1 && c.Gen == 0 && !moved
	if v.outcome != "" && v.outcome != "lookup" && !firstSent {
		res.attempts = append(res.attempts, outbox.Attempt{
			OutboxID: c.ID, Number: c.Attempt, StartedAt: started, Latency: out.Latency, Outcome: v.outcome,
			HTTPStatus: out.HTTPStatus, ProviderCode: out.Code, Error: v.errText, Sender: s.cfg.Name, Provider: r.Name,
		})
	}
	if v.letter {
		// A replay is covered by the key only where no other provider of
		// the list may have the message: one named by the verdict, or any
		// not yet asked about a row whose records may have lost a move.
		elsewhere := v.elsewhere
		if elsewhere == "" && everywhere != nil && *everywhere {
			elsewhere = "another"
		}
		idem := deadletter.ProviderNotIdempotent
		if f.idempotent && elsewhere == "" {
			idem = deadletter.ProviderIdempotent
		}
		res.letter = &deadletter.Letter{
			OutboxID: c.ID, Reason: v.reason, Error: v.errText, ProviderCode: out.Code, Idempotency: idem, Elsewhere: elsewhere,
		}
	}
	s.calling.Add(-1)
	results <- res
	return called || lookup != nil
}

// attributeFound keeps, of the messages a lookup by content found, those
// that are the row's: a message whose id another row with the same number
// and text holds is that row's, and while such a row's message is not
// identified, nothing found can be told apart from it, so the lookup
// settles nothing (an error: asked again later, then unknown).
func (s *Sender) attributeFound(ctx context.Context, c outbox.Claim, p Provider, q provider.LookupQuery, lr provider.LookupResult) provider.LookupResult {
	dbCtx, cancel := context.WithTimeout(ctx, s.cfg.DBTimeout)
	defer cancel()
	twins, err := outbox.Twins(dbCtx, s.cfg.Pool, c.ID, c.To, c.Body, twinsSince(q.Since, lr.Found, p.Timeout()))
	if err != nil {
		lr.Found, lr.Err = nil, fmt.Errorf("lookup: read the rows with the same text: %w", err)
		return lr
	}
	// The row's own provider id is never known here: a callback that
	// names it moves the row to sent or later, and such a row is never
	// claimed.
	mine, ok := attribute(lr.Found, "", twins)
	if !ok {
		lr.Found, lr.Err = nil, errTwins
		return lr
	}
	lr.Found = mine
	return lr
}

// lookupWait is how long a claimed row's lookup must wait: the settle time
// after the lease a stale claim took over (the dead attempt's request was
// made before it ran out), and the row's due time when an attempt without
// an answer, or a write that missed its claim, set it to the settle time
// (a queued row is claimed up to a second before it is due: the lookup
// still waits for it).
func lookupWait(c outbox.Claim, settle time.Duration) time.Duration {
	var w time.Duration
	if c.Result == outbox.ClaimedStale {
		w = settle - c.LeaseEnded
	}
	if c.LookupPending || c.MaybeAccepted {
		w = max(w, c.DueIn)
	}
	return max(w, 0)
}

// rejectInvalid dead-letters a message that did not come from the relay and
// terminates it: it can never succeed, and must neither crash nor loop. The
// message is held until its letter is stored, however long the dead-letter
// stream is away, so it can never run out of deliveries unlettered.
func (s *Sender) rejectInvalid(hold context.Context, h held, id uuid.UUID, why string) {
	s.metrics.decisions.WithLabelValues("invalid").Inc()
	payload := h.msg.Data()
	if len(payload) > wire.MaxPayload {
		// The letter must fit the dead-letter stream whatever arrived.
		payload = payload[:wire.MaxPayload]
	}
	l := deadletter.Letter{OutboxID: id, Reason: wire.ReasonInvalid, Error: why, Payload: payload}
	if h.md != nil {
		l.StreamSeq = h.md.Sequence.Stream
	}
	s.invalid.Add(1)
	go func() {
		defer s.invalid.Done()
		if _, ok := s.publishLetter(hold, l); !ok {
			// Shutdown with the dead-letter stream still away: another
			// sender takes the message over.
			h.answer(func(m jetstream.Msg) { _ = m.Nak() })
			return
		}
		s.log.Warn("invalid message dead-lettered", "reason", why, "outbox_id", id.String())
		h.answer(func(m jetstream.Msg) { _ = m.Term() })
	}()
}

// lookupDetail is a lookup's answer for the attempts log and the evidence:
// what was found, never the number or the body.
func lookupDetail(r provider.LookupResult) string {
	switch lookupOf(r) {
	case "failed":
		return "lookup failed: " + r.Err.Error()
	case "none":
		return "lookup: the provider has no message for this reference"
	case "found":
		return fmt.Sprintf("lookup: the provider has the message (%s)", r.Found[0].Status)
	}
	return fmt.Sprintf("lookup: the provider has %d messages for this reference", len(r.Found))
}

// call makes one call to r's provider, its circuit told of the result
// when it admitted the call (a call it did not admit, a row that cannot
// move, changes nothing there).
func (s *Sender) call(ctx context.Context, r *route, c outbox.Claim) provider.Outcome {
	admitted := r.br.Admit()
	out := r.Provider.Send(ctx, provider.Message{Key: c.ID.String(), To: c.To, Body: c.Body, ExpiresAt: c.ExpiresAt})
	switch {
	case out.Kind == provider.Expired && admitted:
		// Nothing was sent: the provider's health is not in question.
		r.br.Cancel()
	case admitted:
		r.br.Done(healthy(out))
	}
	if r.Name != "" && out.Kind != provider.Expired {
		s.metrics.providerCalls.WithLabelValues(r.Name, out.Kind.String()).Inc()
	}
	return out
}

// flowToken takes a token of the shared rate for a second request of one
// claim, waiting no later than the last moment the call may start.
func (s *Sender) flowToken(ctx context.Context, deadline time.Time, r *route) bool {
	if s.cfg.Flow == nil {
		return true
	}
	wctx, cancel := context.WithDeadline(ctx, deadline.Add(-r.Provider.Timeout()))
	defer cancel()
	return s.cfg.Flow.Wait(wctx) == nil
}

// resultProvider names the provider a result sets on its row: the one
// called, or the one whose lookup answered; "" (the row's stays) for an
// unnamed provider or an attempt that asked no one.
func resultProvider(r *route, called bool, lookup *outbox.Evidence) string {
	if called || lookup != nil {
		return r.Name
	}
	return ""
}

// askElsewhere asks every provider but r whether it has c's message, for a
// row whose provider is uncertain (facts.uncertain). It returns the
// verdict to go on with (v unchanged when every one answered none), the
// provider that has the message (nil if none), the evidence of the lookup
// that settled the row, and the row's lookup_everywhere mark: true when
// not every provider could be asked yet (the next claim asks them first,
// whatever else it finds), false once each answered.
//
// A provider that cannot be asked (no lookups, or the row is older than
// the lookups' retention, so that "none" proves nothing) ends the row
// unknown when the row's records have certainly lost an attempt (a
// redelivery whose previous claim the row does not show): caution wins.
// On the weaker doubts (a stale claim, a republication, a row past the
// dedup window), which a sender outage or a parked retry also raise, it is
// passed over, as a single provider that cannot be asked would be called.
func (s *Sender) askElsewhere(ctx context.Context, c outbox.Claim, r *route, v verdict, f facts, pol policy, deadline time.Time, res *result) (verdict, *route, *outbox.Evidence, *bool) {
	pending, done := ptr(true), ptr(false)
	pastRetention := s.cfg.LookupRetention > 0 && c.Age > s.cfg.LookupRetention
	var ask []*route
	for _, y := range s.routes {
		if y == r {
			continue
		}
		if y.Provider.CanLookup() && !pastRetention {
			ask = append(ask, y)
			continue
		}
		if f.redelivered {
			why := "cannot be asked"
			if pastRetention {
				why = "cannot tell after its lookup retention"
			}
			return verdict{status: outbox.StatusUnknown, reason: wire.ReasonAmbiguous, action: term, maybe: true, outcome: "ambiguous", letter: true,
				errText:   "an earlier attempt was lost with its records, and provider " + y.Name + " of SMS_PROVIDERS, which may have the message, " + why,
				elsewhere: y.Name}, nil, nil, done
		}
	}
	if len(ask) == 0 {
		return v, nil, nil, done
	}
	if w := lookupWait(c, pol.settle); w > 0 {
		// A request made just before the lease ran out may not show yet.
		f.lookupWait = w
		return deferLookup(f, pol), nil, nil, pending
	}
	q := provider.LookupQuery{Reference: c.ID.String(), To: c.To, Body: c.Body, Since: c.CreatedAt}
	for _, y := range ask {
		// Each lookup takes a token of its own: the claim's is the call's.
		if !s.flowToken(ctx, deadline, y) {
			return decideNoTime(f, false, pol), nil, nil, pending
		}
		started := time.Now()
		lr := y.Provider.Lookup(ctx, q)
		if lr.Err == nil && len(lr.Found) > 0 && y.Provider.LookupByContent() {
			lr = s.attributeFound(ctx, c, y.Provider, q, lr)
		}
		result := lookupOf(lr)
		s.metrics.lookups.WithLabelValues(result).Inc()
		res.attempts = append(res.attempts, outbox.Attempt{
			OutboxID: c.ID, Number: c.Attempt, StartedAt: started, Latency: lr.Latency, Outcome: "lookup",
			Error: lookupDetail(lr), Sender: s.cfg.Name, Provider: y.Name,
		})
		if result == "none" {
			continue
		}
		lv := decideLookup(f, lr, pol)
		ev := &outbox.Evidence{Kind: "lookup", Result: result, ProviderRef: lv.ref, Detail: lookupDetail(lr),
			ReceivedAt: time.Now(), Source: "sender"}
		if result == "failed" {
			return lv, nil, ev, pending
		}
		return lv, y, ev, done
	}
	return v, nil, nil, done
}

func ptr[T any](v T) *T { return &v }

// expiredAt reports whether a row expiring at exp (zero: never) has
// expired at now: no call may start at or after its expiry.
func expiredAt(exp, now time.Time) bool { return !exp.IsZero() && !now.Before(exp) }
