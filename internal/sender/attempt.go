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
// it are two requests: the call takes a token of its own first.
//
// What to do is the plan's (plan.go, made of decide's verdicts): this reads
// the claim's facts, carries out each step the plan names (a lookup, a
// token, a move, the call) feeding its outcome back, and writes the result
// once the plan finishes.
//
// deadline is when the claim's lease ends by the local clock, counted from
// before the claim was sent (so never later than the lease the database
// stamped): the lookup and the call are bounded by it, and a call that
// could outlive it is not made, so that no attempt ever overlaps the next
// claim's.
func (s *Sender) attempt(ctx context.Context, h held, c outbox.Claim, deadline time.Time, results chan<- result) bool {
	// A traced message's lookup and call are spans of its trace, and its
	// lines carry the trace's id.
	w := walk{s: s, ctx: h.traced(ctx), c: c, deadline: deadline, res: result{held: h, createdAt: c.CreatedAt}}
	p := s.planOf(h, &w.c, deadline)
	if !p.unknown {
		// The lookup and the call run to their own timeouts even during
		// shutdown (abandoning them would only leave the outcome unknown),
		// but never past the claim's lease.
		var cancel context.CancelFunc
		w.leased, cancel = context.WithDeadline(context.WithoutCancel(w.ctx), deadline)
		defer cancel()
	}
	for st := p.next(outcome{now: time.Now()}); st.kind != stepFinish; {
		st = p.next(w.do(&p, st))
	}
	w.finish(&p)
	s.calling.Add(-1)
	results <- w.res
	return p.called || w.lookup != nil
}

// walk is what one claim's steps did, for its result.
type walk struct {
	s        *Sender
	ctx      context.Context // the message's, traced
	leased   context.Context // ctx, bounded by the lease and not by shutdown
	c        outbox.Claim
	deadline time.Time
	res      result
	// lookup is the evidence of the lookup that settled the row, if any.
	lookup *outbox.Evidence
	// calls counts the calls made; started is when the last began (or,
	// without a call, when the row was finished).
	calls   int
	started time.Time
}

// logAt writes a line about the claim. The row's attributes are formatted
// only for a line that is written: a logger made With them for every
// attempt formatted them eagerly, 3-6 us of CPU per message in
// BenchmarkSenderRun's profile.
func (w *walk) logAt(level slog.Level, msg string, args ...any) {
	if w.s.log.Enabled(w.ctx, level) {
		head := []any{"outbox_id", w.c.ID.String(), "attempt", w.c.Attempt}
		if id := tracing.TraceID(w.ctx); id != "" {
			head = append(head, "trace_id", id)
		}
		w.s.log.Log(w.ctx, level, msg, append(head, args...)...)
	}
}

// planOf gathers what the plan decides on: the claim's facts about the row
// and its provider, read once, before the first step.
func (s *Sender) planOf(h held, c *outbox.Claim, deadline time.Time) plan {
	r := s.route(c.Provider)
	if r == nil {
		// A provider this sender was not given: nothing else is read.
		return plan{unknown: true, f: facts{lastDelivery: s.lastDelivery(h.md)}, pol: policy{maxNakDelay: s.cfg.MaxNakDelay}}
	}
	cur := peerOf(r)
	f := facts{
		stale: c.Result == outbox.ClaimedStale, idempotent: cur.idempotent,
		attempt: c.Attempt, maxAttempts: c.MaxAttempts, maybeAccepted: c.MaybeAccepted,
		lastDelivery: s.lastDelivery(h.md), canLookup: cur.canLookup,
		lookupPending: c.LookupPending, lookups: c.Lookups, lookupBudget: s.cfg.LookupBudget, republished: c.Gen > 0,
		redelivered: unaccounted(h.md, c.PrevDelivery, c.HandedBack), everywhere: c.LookupEverywhere,
		expired: expiredAt(c.ExpiresAt, time.Now()), suppressed: c.SuppressedBy != "",
	}
	pol := policy{backoff: Backoff(c.Attempt, s.cfg.RetryBase, s.cfg.RetryCap), maxNakDelay: s.cfg.MaxNakDelay, settle: s.cfg.LookupSettle}
	if f.looksUp() || s.failover() {
		f.beyondDedup = c.Attempt == 1 && c.Gen == 0 && s.horizon.beyond(c.Age, c.CreatedAt)
	}
	pastRetention := s.cfg.LookupRetention > 0 && c.Age > s.cfg.LookupRetention
	if f.canLookup {
		// (An expired row is looked up at a provider that honours keys
		// too: it may not be called again.)
		f.lookupWait = lookupWait(*c, pol.settle)
		f.pastRetention = pastRetention
	}
	p := plan{f: f, pol: pol, cur: cur, failover: s.failover(), expiresAt: c.ExpiresAt, deadline: deadline}
	if p.failover && f.uncertain() {
		// Every other provider may be asked first: the plan knows them all.
		p.peers = make([]peer, len(s.routes))
		for i, y := range s.routes {
			p.peers[i] = peerOf(y)
		}
		p.wait, p.pastRetention = lookupWait(*c, pol.settle), pastRetention
	}
	return p
}

// peerOf is what a plan knows of r.
func peerOf(r *route) peer {
	return peer{at: r.at, name: r.Name, idempotent: r.Provider.Idempotent(), canLookup: r.Provider.CanLookup(), timeout: r.Provider.Timeout()}
}

// do carries out one step of p and reports its outcome.
func (w *walk) do(p *plan, st step) outcome {
	s, c := w.s, &w.c
	r := s.routes[st.at]
	var o outcome
	switch st.kind {
	case stepCircuit:
		o.ok = r.br.Ready()
	case stepAlternative:
		o.alt = noPeer
		if alt := s.alternative(r); alt != nil {
			o.alt = peerOf(alt)
		}
	case stepToken:
		o.ok = s.flowToken(w.leased, w.deadline, r)
	case stepRepin:
		from := s.routes[p.cur.at]
		o.ok = s.repin(w.leased, *c, from, r)
		if o.ok && w.calls > 0 {
			// The row moves on after its provider did not take the call:
			// that call is logged, a retry at the provider it left.
			out := p.out
			w.logAt(slog.LevelInfo, "provider did not take the message; moved to the next", "from", from.Name, "to", r.Name,
				"http_status", out.HTTPStatus, "reason", out.Reason)
			w.res.attempts = append(w.res.attempts, outbox.Attempt{
				OutboxID: c.ID, Number: c.Attempt, StartedAt: w.started, Latency: out.Latency, Outcome: "retry",
				HTTPStatus: out.HTTPStatus, ProviderCode: out.Code, Sender: s.cfg.Name, Provider: from.Name,
				Error: "not taken, moved to " + r.Name + ": " + out.Error(),
			})
		}
	case stepLookElsewhere:
		var result, detail string
		o.lookup, result, detail = w.lookUp(r)
		if result != "none" {
			// Only an answer other than none settles the row: the row's own
			// provider is asked or called next otherwise.
			w.lookup = evidence(o.lookup, result, detail)
		}
	case stepLookUp:
		var result, detail string
		o.lookup, result, detail = w.lookUp(r)
		w.logAt(slog.LevelInfo, "provider lookup", "result", result, "found", len(o.lookup.Found), "latency", o.lookup.Latency.String(), "err", o.lookup.Err)
		w.lookup = evidence(o.lookup, result, detail)
	case stepCall:
		w.started = time.Now()
		o.call = s.call(w.leased, r, *c)
		o.notTaken = notTaken(r.Provider, o.call)
		w.calls++
	}
	o.now = time.Now()
	return o
}

// lookUp asks r's provider which messages it has for the row's reference,
// keeps those that are the row's, and records the lookup in the attempts
// log; it returns the answer, its class (lookupOf) and its detail.
func (w *walk) lookUp(r *route) (provider.LookupResult, string, string) {
	s, c := w.s, &w.c
	started := time.Now()
	q := provider.LookupQuery{Reference: c.ID.String(), To: c.To, Body: c.Body, Since: c.CreatedAt}
	lr := r.Provider.Lookup(w.leased, q)
	if lr.Err == nil && len(lr.Found) > 0 && r.Provider.LookupByContent() {
		lr = s.attributeFound(w.leased, *c, r.Provider, q, lr)
	}
	result, detail := lookupOf(lr), lookupDetail(lr)
	s.metrics.lookups.WithLabelValues(result).Inc()
	w.res.attempts = append(w.res.attempts, outbox.Attempt{
		OutboxID: c.ID, Number: c.Attempt, StartedAt: started, Latency: lr.Latency, Outcome: "lookup",
		Error: detail, Sender: s.cfg.Name, Provider: r.Name,
	})
	return lr, result, detail
}

// evidence is a lookup's answer as the row's evidence: the provider's id
// for the message when it found one.
func evidence(lr provider.LookupResult, result, detail string) *outbox.Evidence {
	ev := &outbox.Evidence{Kind: "lookup", Result: result, Detail: detail, ReceivedAt: time.Now(), Source: "sender"}
	if result == "found" {
		ev.ProviderRef = lr.Found[0].Ref
	}
	return ev
}

// finish makes the result of p's verdict: the metrics and lines of the
// attempt, the row's write, its attempts-log record and its dead letter.
func (w *walk) finish(p *plan) {
	s, c, v := w.s, &w.c, p.v
	if p.unknown {
		s.metrics.heldBack.WithLabelValues("provider_unknown").Inc()
		w.logAt(slog.LevelWarn, "row belongs to a provider this sender does not have; left for one that has it", "provider", c.Provider)
		w.res.action, w.res.delay = v.action, v.delay
		w.res.row = outbox.Result{
			ID: c.ID, Status: v.status, Error: v.errText, RetryIn: v.delay, Park: v.park, Token: c.Token,
			MaybeAccepted: c.MaybeAccepted, LookupPending: c.LookupPending, Refund: true, Attempt: c.Attempt, Gen: c.Gen}
		return
	}
	r, out := s.routes[p.cur.at], p.out
	if p.heldBack != "" {
		s.metrics.heldBack.WithLabelValues(p.heldBack).Inc()
		w.logAt(slog.LevelDebug, "attempt held back", "why", p.heldBack, "retry_in", v.delay.String())
	}
	if w.calls == 0 {
		w.started = time.Now()
	} else {
		if p.called {
			s.metrics.providerSeconds.Observe(out.Latency.Seconds())
		}
		w.logAt(slog.LevelDebug, "provider attempt", "outcome", out.Kind.String(), "http_status", out.HTTPStatus,
			"provider_code", out.Code, "latency", out.Latency.String())
		if out.Kind == provider.Sent {
			crashpoint.Hit(crashpoint.SenderAfterAccept)
		}
	}
	if v.pause && s.cfg.Flow != nil {
		s.cfg.Flow.Pause(w.ctx, out.After)
	}
	if v.outcome != "lookup" {
		s.metrics.count(p.called, v.outcome)
	}
	if v.status == outbox.StatusSuppressed {
		source := c.SuppressedBy
		if v.suppress {
			source = outbox.SourceRefusal
		}
		s.metrics.suppressedRow(source, p.called)
	}
	if v.suppress {
		w.logAt(slog.LevelInfo, "the provider refused the message: the recipient opted out; the number goes on the suppression list",
			"provider", r.Name, "http_status", out.HTTPStatus, "provider_code", out.Code, "status", string(v.status))
	}
	switch {
	case v.letter && v.status == outbox.StatusUnknown:
		w.logAt(slog.LevelWarn, "outcome unknown; not retried", "reason", v.reason, "http_status", out.HTTPStatus)
	case v.letter:
		w.logAt(slog.LevelInfo, "message will not be sent", "status", string(v.status), "reason", v.reason,
			"http_status", out.HTTPStatus, "provider_code", out.Code)
	case v.park:
		w.logAt(slog.LevelDebug, "retry parked in Postgres", "retry_in", v.delay.String())
	}

	var everywhere *bool
	if p.everywhereSet {
		everywhere = ptr(p.everywhere)
	}
	res := &w.res
	res.action, res.delay = v.action, v.delay
	res.row = outbox.Result{
		ID: c.ID, Status: v.status, Error: v.errText, Reason: v.reason, RetryIn: v.delay, Park: v.park,
		Token: c.Token, MaybeAccepted: v.maybe, Refund: v.refund, LookupPending: v.lookupPending, Attempt: c.Attempt, Gen: c.Gen,
		LookupFailed: v.lookupFailed, NotAccepted: v.notAccepted, Lookup: w.lookup, Provider: resultProvider(r, p.called, w.lookup), LookupEverywhere: everywhere,
	}
	switch {
	case p.called && v.status == outbox.StatusSent:
		res.row.ProviderRef = out.Ref
	case !p.called:
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
	firstSent := v.outcome == "sent" && c.Attempt == 1 && c.Gen == 0 && !p.moved
	if v.outcome != "" && v.outcome != "lookup" && !firstSent {
		res.attempts = append(res.attempts, outbox.Attempt{
			OutboxID: c.ID, Number: c.Attempt, StartedAt: w.started, Latency: out.Latency, Outcome: v.outcome,
			HTTPStatus: out.HTTPStatus, ProviderCode: out.Code, Error: v.errText, Sender: s.cfg.Name, Provider: r.Name,
		})
	}
	if v.letter {
		// A replay is covered by the key only where no other provider of
		// the list may have the message: one named by the verdict, or any
		// not yet asked about a row whose records may have lost a move.
		elsewhere := v.elsewhere
		if elsewhere == "" && p.everywhereSet && p.everywhere {
			elsewhere = "another"
		}
		idem := deadletter.ProviderNotIdempotent
		if p.f.idempotent && elsewhere == "" {
			idem = deadletter.ProviderIdempotent
		}
		res.letter = &deadletter.Letter{
			OutboxID: c.ID, Reason: v.reason, Error: v.errText, ProviderCode: out.Code, Idempotency: idem, Elsewhere: elsewhere,
		}
	}
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

func ptr[T any](v T) *T { return &v }

// expiredAt reports whether a row expiring at exp (zero: never) has
// expired at now: no call may start at or after its expiry.
func expiredAt(exp, now time.Time) bool { return !exp.IsZero() && !now.Before(exp) }
