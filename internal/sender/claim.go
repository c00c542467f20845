package sender

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sendonce/sendonce/internal/backoff"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/wire"
)

// held is a message and the heartbeats that hold it.
type held struct {
	msg  jetstream.Msg
	keep func()
	// md is the delivery's metadata, parsed once from its reply subject
	// when it was fetched; nil if that failed.
	md *jetstream.MsgMetadata
	// trace is the span of the message's processing, in the trace its
	// traceparent header continues; nil when untraced.
	trace trace.Span
}

// answer stops the heartbeats and answers JetStream with fn.
func (h held) answer(fn func(jetstream.Msg)) {
	h.keep()
	fn(h.msg)
}

// claimLoop takes messages as slots and tokens free up, the most urgent lane
// first, claims them in batches and hands each claimed row to a worker. The
// token is taken once a message waits, and before it is picked, so that the
// message chosen is the most urgent one waiting when the provider may be
// called, and before the row is claimed, so that a wait (a rate limit, a
// provider's pause) spends no attempt. A sender with nothing to send holds
// no token: one taken while idle would be spent later, on top of what the
// sender's share then allows. It returns when ctx is done (after the batch
// in hand is claimed).
func (s *Sender) claimLoop(ctx, hold context.Context, ls *lanes, slots chan struct{}, results chan<- result, work chan<- func()) {
	batch := make([]held, 0, s.cfg.ClaimBatch)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if !ls.wait(ctx) {
			<-slots
			return
		}
		if err := s.waitToken(ctx); err != nil {
			<-slots
			return
		}
		h, ok := ls.pick()
		if !ok {
			// Only this loop takes messages: one that waited is there.
			s.returnToken()
			<-slots
			continue
		}
		batch = append(batch[:0], h)
		// Take whatever else is already waiting, while slots and tokens are
		// free. With messages waiting and every slot busy, the loop waits
		// up to ClaimLinger for running attempts to free slots, so that a
		// busy sender claims in batches rather than a row or two at a time
		// (fewer, larger claims and status writes: less Postgres work per
		// message); with no message waiting it claims at once.
		var linger *time.Timer
	more:
		for len(batch) < s.cfg.ClaimBatch {
			select {
			case slots <- struct{}{}:
			default:
				// Only slots held by attempts already running free up:
				// those the batch holds are its own.
				if s.cfg.ClaimLinger <= 0 || ls.waiting() == 0 || len(slots) <= len(batch) {
					break more
				}
				if linger == nil {
					linger = time.NewTimer(s.cfg.ClaimLinger)
				}
				select {
				case slots <- struct{}{}:
				case <-linger.C:
					break more
				case <-ctx.Done():
					break more
				}
			}
			if !s.tryToken() {
				<-slots
				break more
			}
			h, ok := ls.pick()
			if !ok {
				s.returnToken()
				<-slots
				break more
			}
			batch = append(batch, h)
		}
		if linger != nil {
			linger.Stop()
		}
		s.claimBatch(ctx, hold, batch, slots, results, work)
	}
}

func (s *Sender) waitToken(ctx context.Context) error {
	if s.cfg.Flow == nil {
		return ctx.Err()
	}
	// Messages waiting while the rate limit or a provider's pause holds
	// the loop wait on purpose: readiness does not count that time.
	s.health.throttled(true)
	defer s.health.throttled(false)
	return s.cfg.Flow.Wait(ctx)
}

func (s *Sender) tryToken() bool { return s.cfg.Flow == nil || s.cfg.Flow.TryTake() }

// returnToken gives back the token of a message that made no request.
func (s *Sender) returnToken() {
	if s.cfg.Flow != nil {
		s.cfg.Flow.Return()
	}
}

// claimBatch claims the rows of batch, which holds one slot per message, and
// hands each claimed row's attempt to the workers (work, never full: it holds
// at most one attempt a slot); every other message gets its answer here and
// gives its slot back.
func (s *Sender) claimBatch(ctx, hold context.Context, batch []held, slots chan struct{}, results chan<- result, work chan<- func()) {
	// release gives back the slot, and the token, of a message that makes
	// no request.
	release := func() {
		s.returnToken()
		<-slots
	}
	s.health.taken()
	byID := make(map[uuid.UUID][]held, len(batch))
	ids := make([]uuid.UUID, 0, len(batch))
	for i := range batch {
		s.startTrace(&batch[i])
		h := batch[i]
		// Every message is held from its fetch until JetStream is answered:
		// a claim that waits out a database outage, a slow call or a slow
		// status write never lets the ack deadline pass and the message go
		// to another sender.
		if h.md != nil && h.md.NumDelivered > 1 {
			s.metrics.redeliveries.Inc()
		}
		p, err := wire.Decode(h.msg.Data())
		if err != nil {
			s.rejectInvalid(hold, h, uuid.Nil, err.Error())
			release()
			continue
		}
		if _, seen := byID[p.ID]; !seen {
			ids = append(ids, p.ID)
		}
		byID[p.ID] = append(byID[p.ID], h)
	}
	if len(ids) == 0 {
		return
	}
	s.metrics.claimRows.Observe(float64(len(ids)))
	from := make([]outbox.Delivery, len(ids))
	for i, id := range ids {
		from[i] = deliveryOf(byID[id][0].md)
	}
	provs := s.providers()
	if len(s.cfg.LaneProviders) > 0 && provs.Preferred != "" {
		provs.Each = make([]string, len(ids))
		for i, id := range ids {
			provs.Each[i] = s.lanePreference(byID[id][0].msg.Subject())
		}
	}
	claimStart := time.Now()
	claims, deadline, ok := s.claim(hold, ids, from, provs)
	claimEnd := time.Now()
	if !ok {
		// Given up at shutdown without an answer: whether the claim took
		// the rows is unknown; another sender's claim will find out.
		for _, id := range ids {
			for _, h := range byID[id] {
				h.answer(func(m jetstream.Msg) { _ = m.Nak() })
				release()
			}
		}
		return
	}
	// Deliveries that back off without a claim are handed back once the
	// batch is sorted out, recorded in their rows first.
	var (
		back   []held
		delays []time.Duration
	)
	defer func() { s.handBack(hold, back, delays) }()
	for _, c := range claims {
		hs := byID[c.ID]
		// A second copy of the same row in one batch (a republication)
		// waits for the first copy's attempt like any concurrent delivery.
		for _, h := range hs[1:] {
			back, delays = append(back, h), append(delays, s.cfg.Lease)
			release()
		}
		h := hs[0]
		if h.trace != nil {
			s.step(h, "UPDATE sms_outbox", "UPDATE", claimStart, claimEnd, nil, otelattr.String("sendonce.claim", claimResults[c.Result]))
		}
		switch c.Result {
		case outbox.Claimed, outbox.ClaimedStale:
			s.calling.Add(1)
			work <- func() {
				defer func() { <-slots }()
				if !s.attempt(ctx, h, c, deadline, results) {
					s.returnToken()
				}
			}
		case outbox.AlreadyTerminal:
			// The guard that makes a redelivery or a late republication
			// harmless: this row is finished, never call again.
			s.metrics.skipped.Inc()
			h.answer(func(m jetstream.Msg) { _ = m.Ack() })
			h.endTrace("finished before this delivery", false)
			release()
		case outbox.Leased:
			s.metrics.leased.Inc()
			h.endTrace("held by another claim", false)
			back, delays = append(back, h), append(delays, c.LeaseLeft+backoff.Jitter(time.Second))
			release()
		case outbox.NotFound:
			s.rejectInvalid(hold, h, c.ID, "no outbox row with this id")
			release()
		case outbox.Expired:
			// The claim ended the row: its expiry came before any call.
			s.metrics.decisions.WithLabelValues("expired").Inc()
			h.answer(func(m jetstream.Msg) { _ = m.Ack() })
			h.endTrace("expired", false)
			release()
		case outbox.Suppressed:
			// The claim ended the row: its number is on the suppression
			// list, and no provider is called for it.
			s.metrics.suppressedRow(c.SuppressedBy, false)
			h.answer(func(m jetstream.Msg) { _ = m.Ack() })
			h.endTrace("suppressed", false)
			release()
		}
	}
}

// claim claims ids under a token of its own and returns the claims. A claim
// that fails (the database is down, or its answer was lost after it
// committed) is run again with the same token until it answers: the rows it
// took come back as claimed by it, never as "another sender died mid-call",
// and the messages are not handed back, so no delivery is spent on an
// outage. It gives up, returning false, only when hold is done. The
// deadline is the end of the claims' lease by the local clock, counted from
// before the claim that answered was sent: never later than the lease the
// database stamped, whatever the round trip took.
func (s *Sender) claim(hold context.Context, ids []uuid.UUID, from []outbox.Delivery, provs outbox.Providers) ([]outbox.Claim, time.Time, bool) {
	token := uuid.New()
	for failures := 0; ; {
		deadline := time.Now().Add(s.cfg.Lease)
		dbCtx, cancel := context.WithTimeout(hold, s.cfg.DBTimeout)
		claims, err := outbox.ClaimForSendTo(dbCtx, s.cfg.Pool, ids, from, s.cfg.Lease, token, provs)
		cancel()
		if err == nil {
			// Each expiry by this sender's clock: no later than the
			// database's, whatever the two clocks say (counted from
			// before the claim was sent, as the lease is).
			sent := deadline.Add(-s.cfg.Lease)
			for i := range claims {
				if !claims[i].ExpiresAt.IsZero() {
					claims[i].ExpiresAt = sent.Add(claims[i].ExpiresLeft)
				}
			}
			s.health.claimed()
			if failures > 0 {
				s.log.Info("claim answered after failures; the messages were held meanwhile", "failures", failures, "messages", len(ids))
			}
			return claims, deadline, true
		}
		failures++
		s.health.claimFailed()
		s.metrics.dbRetries.WithLabelValues("claim").Inc()
		d := min(5*time.Second, 100*time.Millisecond<<min(failures, 6))
		if retrying(failures) {
			s.log.Warn("claim failed; holding the messages and trying again with the same claim token", "err", err, "messages", len(ids), "failures", failures, "retry_in", d.String())
		}
		if !backoff.Sleep(hold, backoff.Jitter(d)) {
			s.log.Error("claim still failing at the shutdown timeout; its messages go back to JetStream", "err", err, "messages", len(ids))
			return nil, time.Time{}, false
		}
	}
}

// deliveryOf names the delivery of md (zero when its metadata could not be
// read), for the row's record of its claim.
func deliveryOf(md *jetstream.MsgMetadata) outbox.Delivery {
	if md == nil {
		return outbox.Delivery{}
	}
	return outbox.Delivery{Seq: md.Sequence.Stream, Count: int(md.NumDelivered)}
}

// unaccounted reports whether this delivery is a redelivery whose previous
// delivery the row does not account for: its claim and its outcome may
// have been lost with a failed-over primary, and the row's history is not
// to be trusted. A row accounts for the previous delivery when it shows
// that delivery's claim (which shows what it did: a retry written after a
// NakWithDelay, a lookup pending), or its hand-back (handed back unclaimed
// at a graceful stop, or backed off from a live claim: no call); a row
// that shows this very delivery's claim is a claim run again.
func unaccounted(md *jetstream.MsgMetadata, prev, back outbox.Delivery) bool {
	if md == nil || md.NumDelivered <= 1 {
		return false
	}
	n, seq := int(md.NumDelivered), md.Sequence.Stream
	if prev.Seq == seq && (prev.Count == n-1 || prev.Count == n) {
		return false
	}
	return back.Seq != seq || back.Count != n-1
}

// handBack gives messages back to JetStream unclaimed: each with a Nak
// after delay (0: at once), or an ack on its last delivery, where a Nak
// would not bring it back. Before that it records the hand-backs in their
// rows (outbox.HandBack), so that the next delivery of each is known to
// follow one that made no call; a record that cannot be written within
// the database timeout leaves that doubt in place (caution), and the
// messages go back all the same.
func (s *Sender) handBack(ctx context.Context, hs []held, delays []time.Duration) {
	if len(hs) == 0 {
		return
	}
	ids := make([]uuid.UUID, 0, len(hs))
	from := make([]outbox.Delivery, 0, len(hs))
	for _, h := range hs {
		if h.md == nil || h.md.NumDelivered < 1 {
			continue
		}
		p, err := wire.Decode(h.msg.Data())
		if err != nil {
			continue
		}
		ids, from = append(ids, p.ID), append(from, deliveryOf(h.md))
	}
	if len(ids) > 0 {
		dbCtx, cancel := context.WithTimeout(ctx, s.cfg.DBTimeout)
		n, err := outbox.HandBack(dbCtx, s.cfg.Pool, ids, from)
		cancel()
		if err != nil {
			s.log.Warn("could not record messages handed back unclaimed; their next deliveries will be treated as possibly lost attempts", "messages", len(ids), "err", err)
		}
		s.metrics.handedBack.Add(float64(n))
	}
	for i, h := range hs {
		var d time.Duration
		if delays != nil {
			d = delays[i]
		}
		// On its last delivery a message is acked instead (backOff): a Nak
		// would not bring it back, and the reconciler republishes the row.
		h.answer(func(m jetstream.Msg) { s.backOff(m, h.md, d) })
	}
}
