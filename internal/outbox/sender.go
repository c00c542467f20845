package outbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ClaimResult says what a sender found when it claimed a row for one attempt.
type ClaimResult int

// The results of ClaimForSend, one per requested id.
const (
	// Claimed: the row is now sending under this claim and the attempt may
	// call the provider. A claim run again with the same token (its first
	// answer was lost) finds the rows it took as Claimed again, with the
	// same attempt number.
	Claimed ClaimResult = iota + 1
	// ClaimedStale: as Claimed, but the row was found sending under another
	// claim whose lease had run out: that attempt ended without reporting
	// back (its sender died, or lost the database for longer than its
	// lease), and its outcome is unknown.
	ClaimedStale
	// AlreadyTerminal: the row is finished (sent, dead or unknown); ack and
	// skip.
	AlreadyTerminal
	// Leased: another claim holds a live lease (a concurrent delivery of
	// the same row), or the row waits for its retry time (a second copy of
	// its message); back off for LeaseLeft without calling the provider.
	Leased
	// NotFound: no row has this id; the message did not come from the relay.
	NotFound
	// Expired: the row had reached its expires_at with no attempt that may
	// have been taken, and the claim ended it expired instead: ack and
	// skip, no call.
	Expired
	// Suppressed: the row's number is on the suppression list
	// (sms_suppressions) and no attempt may have been taken, and the claim
	// ended it suppressed instead: ack and skip, no call. Claim.SuppressedBy
	// names the entry's source.
	Suppressed
)

// Claim is one row as a sender's claim found it.
type Claim struct {
	// ID is the row id and idempotency key.
	ID uuid.UUID
	// Result is what the claim found.
	Result ClaimResult
	// Prev is the status before the claim (for a claim run again, the
	// status the first run left: sending).
	Prev State
	// To and Body are the message (set when claimed).
	To, Body string
	// Attempt is the number of this attempt, counting from 1 (set when
	// claimed; the claim increments attempt_count once per token).
	Attempt int
	// MaxAttempts is the row's attempt budget.
	MaxAttempts int
	// Gen is the row's publish generation.
	Gen int32
	// Token is the claim's token (set when claimed): every write of this
	// attempt's outcome is fenced on it.
	Token uuid.UUID
	// CreatedAt is when the row became due: its insert time, or its send
	// time for a row written with one (a scheduled row is published no
	// sooner); its age, commit-to-sent latency and lookups count from it.
	CreatedAt time.Time
	// LeaseLeft is how long a live lease or a retry wait still runs (set
	// when Leased).
	LeaseLeft time.Duration
	// MaybeAccepted is set when an earlier attempt, or the attempt this
	// stale claim takes over, may have reached the provider: if the budget
	// runs out, the row ends unknown rather than dead (set when claimed).
	MaybeAccepted bool
	// LookupPending is set when the row's last attempt ended without an
	// answer at a provider without idempotency: a lookup comes before any
	// other call. Lookups counts the lookups that failed (set when claimed).
	LookupPending bool
	Lookups       int
	// Age is how long ago the row was inserted, and DueIn how long until
	// its next_attempt_at as the claim found it (negative once past), both
	// by the database clock (set when claimed). A lookup after an attempt
	// that got no answer is not made before the row is due: a missed
	// write (markMissed) sets the settle time there, even on a pending row.
	Age, DueIn time.Duration
	// LeaseEnded is how long ago the lease a stale claim took over ran out
	// (set when ClaimedStale): the dead attempt's request was made before
	// then, so a lookup waits until the settle time has passed since.
	LeaseEnded time.Duration
	// PrevDelivery is the delivery whose claim the row showed before this
	// one (set when claimed; zero when none was recorded): a redelivery that
	// does not find its previous delivery there may have lost it, with its
	// outcome, to a failover.
	PrevDelivery Delivery
	// HandedBack is the last delivery a sender handed back without a claim
	// (HandBack; set when claimed, zero when none was recorded): a
	// redelivery whose previous delivery was handed back lost nothing.
	HandedBack Delivery
	// Provider is the provider the row belongs to (set when claimed; empty
	// for a row claimed without Providers): every provider that may hold
	// its message, since a row moves only where none can (Repin).
	Provider string
	// LookupEverywhere is set when an earlier claim found that the row's
	// records may have lost an attempt and could not yet ask every other
	// provider (set when claimed).
	LookupEverywhere bool
	// ExpiresAt is the row's expiry, zero when it has none (set when
	// claimed): no call may start at or after it. A row claimed past it
	// has an attempt that may have been taken (it is settled by evidence,
	// never by a call); one without is ended Expired by the claim itself.
	// ExpiresLeft is how long it had left by the database's clock when the
	// claim answered: a sender whose clock differs from the database's
	// counts from its own clock with it.
	ExpiresAt   time.Time
	ExpiresLeft time.Duration
	// SuppressedBy, when not empty, is the source of the suppression-list
	// entry of the row's number (inbound, refusal, receipt, operator,
	// import, app) as the claim found it: set with Result Suppressed, and
	// on a row claimed while its number is on the list, which an earlier
	// attempt may have reached. Such a row is settled by evidence, never
	// by a call (no call starts to a number on the list).
	SuppressedBy string
}

// Providers names the provider a claim gives a row that has none.
type Providers struct {
	// Preferred is where new work goes now: a row never attempted takes it.
	Preferred string
	// Primary is the first provider configured: a row attempted before
	// rows named their provider (before migration 0019) was attempted
	// there, or nowhere.
	Primary string
	// Each, when set, holds a preferred provider per id (in the order of
	// the ids; "" for Preferred): a priority lane's own preference.
	Each []string
}

// Delivery names one delivery of one message: the message's stream
// sequence and the delivery's count (1 for the first).
type Delivery struct {
	Seq   uint64
	Count int
}

// ClaimForSend claims the rows ids for one provider attempt each under the
// claim token token and returns one Claim per distinct id, in no particular
// order. A row is claimed from pending (the relay's commit may lose the race
// with the delivery), queued once its next_attempt_at is due (within a
// second), or sending when its lease has run out; claiming sets it sending,
// increments attempt_count, records the token and stamps a lease of lease
// from the database's clock. A row already sending under token (this claim,
// run again because its answer was lost) is returned as Claimed with its
// lease renewed and its attempt count unchanged, so that a lost answer is
// never mistaken for a sender that died mid-call.
//
// The same statement ends, instead of claiming them, the pending and
// queued rows that no earlier attempt may have reached (no maybe_accepted,
// no lookup owed) and that are past their expiry (Expired) or whose number
// is on the suppression list (Suppressed): no sender can call for such a
// row, since the database refuses any claim of it (migrations 0031, 0032).
//
// Rows are locked in id order with FOR NO KEY UPDATE (which does not block
// the attempts log's foreign-key checks), so concurrent claims of
// overlapping sets cannot deadlock; a row the relay still holds is waited
// for, and then seen as queued.
//
// from, when not nil, holds the delivery each id's claim comes from (in the
// order of ids); it is recorded in the rows claimed (claim_seq,
// claim_delivery), and the delivery the row showed before is returned as
// Claim.PrevDelivery.
func ClaimForSend(ctx context.Context, q Querier, ids []uuid.UUID, from []Delivery, lease time.Duration, token uuid.UUID) ([]Claim, error) {
	return ClaimForSendTo(ctx, q, ids, from, lease, token, Providers{})
}

// ClaimForSendTo is ClaimForSend that also names the provider of each row
// claimed that has none (Providers), and returns it as Claim.Provider.
func ClaimForSendTo(ctx context.Context, q Querier, ids []uuid.UUID, from []Delivery, lease time.Duration, token uuid.UUID, p Providers) ([]Claim, error) {
	seqs, counts := make([]int64, len(ids)), make([]int32, len(ids))
	each := p.Each // nil: NULL, every id's preference the default
	if each != nil && len(each) != len(ids) {
		return nil, fmt.Errorf("outbox: claim rows for sending: %d ids but %d preferred providers", len(ids), len(each))
	}
	if from != nil {
		if len(from) != len(ids) {
			return nil, fmt.Errorf("outbox: claim rows for sending: %d ids but %d deliveries", len(ids), len(from))
		}
		for i, d := range from {
			seqs[i], counts[i] = int64(min(d.Seq, 1<<62)), int32(min(d.Count, 1<<30))
		}
	}
	// The rows are found by their key (id = ANY, an index scan whatever the
	// table's statistics) and locked in id order; ids with no row come back
	// as NotFound from the loop below. One join fewer than a join with the
	// unnested ids: a quarter less planning, which every execution pays.
	rows, _ := q.Query(ctx, claimForSendSQL, uuidArray(ids), lease, [16]byte(token), seqs, counts, p.Preferred, p.Primary, each)
	claims, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claim, error) {
		var (
			c          Claim
			prev       *string
			leaseUntil *time.Time
			due        *time.Time
			claimed    bool
			mine       bool
			to, body   *string
			attempt    *int32
			maxAtt     *int32
			gen        *int32
			createdAt  *time.Time
			now        time.Time
			prevSeq    int64
			prevCount  int32
			backSeq    int64
			backCount  int32
			newStatus  string
			expiresAt  *time.Time
		)
		if err := r.Scan(&c.ID, &prev, &leaseUntil, &due, &claimed, &mine, &to, &body, &attempt, &maxAtt, &gen,
			&createdAt, &c.MaybeAccepted, &c.LookupPending, &c.Lookups, &now, &prevSeq, &prevCount, &c.Provider, &c.LookupEverywhere,
			&backSeq, &backCount, &newStatus, &expiresAt, &c.SuppressedBy); err != nil {
			return c, err
		}
		switch {
		case prev == nil:
			c.Result = NotFound
		case claimed && newStatus == string(StatusExpired):
			c.Prev = State(*prev)
			c.Result = Expired
		case claimed && newStatus == string(StatusSuppressed):
			c.Prev = State(*prev)
			c.Result = Suppressed
		case claimed:
			c.Prev = State(*prev)
			c.Result = Claimed
			if c.Prev == StatusSending && !mine {
				c.Result = ClaimedStale
			}
			c.To, c.Body, c.Token = *to, *body, token
			c.Attempt, c.MaxAttempts, c.Gen = int(*attempt), int(*maxAtt), *gen
			c.CreatedAt = *createdAt
			c.Age, c.DueIn = now.Sub(*createdAt), due.Sub(now)
			if c.Result == ClaimedStale {
				c.LeaseEnded = max(0, now.Sub(*leaseUntil))
			}
			c.PrevDelivery = Delivery{Seq: uint64(max(prevSeq, 0)), Count: int(prevCount)}
			c.HandedBack = Delivery{Seq: uint64(max(backSeq, 0)), Count: int(backCount)}
			if expiresAt != nil {
				c.ExpiresAt, c.ExpiresLeft = *expiresAt, expiresAt.Sub(now)
			}
		default:
			c.Prev = State(*prev)
			if c.Prev.Terminal() {
				c.Result = AlreadyTerminal
				break
			}
			c.Result = Leased
			if c.Prev == StatusQueued {
				c.LeaseLeft = max(0, due.Sub(now))
			} else {
				c.LeaseLeft = max(0, leaseUntil.Sub(now))
			}
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim rows for sending: %w", err)
	}
	if len(claims) < len(ids) {
		found := make(map[uuid.UUID]bool, len(claims))
		for _, c := range claims {
			found[c.ID] = true
		}
		for _, id := range ids {
			if !found[id] {
				found[id] = true // once per distinct id
				claims = append(claims, Claim{ID: id, Result: NotFound})
			}
		}
	}
	return claims, nil
}

// HandBack records, for each of ids, that the delivery from[i] of its
// message goes back to JetStream unclaimed (a sender stopping gracefully,
// or a delivery that met a live claim and backs off): it made no call, and
// the next delivery of the message is not to be taken for one whose claim
// a failover lost. It returns how many rows recorded it. A row records a
// hand-back only when it accounts for the delivery before (its claim or
// its own hand-back shows it) or the delivery is its message's first, and
// only while it is unfinished; otherwise the row is left as it is, and the
// next delivery's doubt stands. Rows are locked in id order, as claims
// lock them. The caller hands the messages back after this returns, so a
// redelivery never overtakes the record of the delivery before it.
func HandBack(ctx context.Context, q Querier, ids []uuid.UUID, from []Delivery) (int64, error) {
	if len(ids) != len(from) {
		return 0, fmt.Errorf("outbox: record hand-backs: %d ids but %d deliveries", len(ids), len(from))
	}
	seqs, counts := make([]int64, len(ids)), make([]int32, len(ids))
	for i, d := range from {
		seqs[i], counts[i] = int64(min(d.Seq, 1<<62)), int32(min(d.Count, 1<<30))
	}
	tag, err := q.Exec(ctx, handBackSQL, uuidArray(ids), seqs, counts)
	if err != nil {
		return 0, fmt.Errorf("outbox: record hand-backs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Repin moves a claimed row from the provider from to the provider to,
// while the claim token still holds it, and reports whether it did. The
// sender moves a row only when none of its attempts can have reached from,
// and before it calls to: so the row always names the one provider that
// may hold its message, even if the sender dies right after the call.
func Repin(ctx context.Context, q Querier, id, token uuid.UUID, from, to string) (bool, error) {
	tag, err := q.Exec(ctx, repinSQL,
		[16]byte(id), [16]byte(token), from, to)
	if err != nil {
		return false, fmt.Errorf("outbox: move a row to provider %s: %w", to, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Result is the outcome of one attempt, to be written to its row.
type Result struct {
	// ID is the row id.
	ID uuid.UUID
	// Status is the row's new status: StatusSent, StatusQueued (a retry),
	// StatusDead or StatusUnknown; or StatusDelivered or StatusUndelivered
	// when a lookup found the provider's report.
	Status State
	// ProviderRef is the provider's message id (StatusSent).
	ProviderRef string
	// Error is the failure, without personal data (other statuses).
	Error string
	// Reason is the dead-letter reason (StatusDead, StatusUnknown).
	Reason string
	// RetryIn is how long after the write the next attempt is due
	// (StatusQueued); the database's clock stamps next_attempt_at.
	RetryIn time.Duration
	// Park marks a retry whose message is acked rather than handed back
	// with a delay (StatusQueued): the row waits in Postgres, and the
	// reconciler republishes it once it is due.
	Park bool
	// Token is the claim token of the attempt (Claim.Token): retry, dead
	// and unknown writes apply only while that claim still holds the row,
	// so that an overtaken attempt changes nothing, nor one from before a
	// replay. A republication by the reconciler keeps the claim, so a slow
	// attempt it overlapped still writes.
	Token uuid.UUID
	// MaybeAccepted marks a retry whose attempt may have reached the
	// provider; it sets the row's sticky maybe_accepted (StatusQueued).
	MaybeAccepted bool
	// Refund gives the attempt back (StatusQueued): the provider refused to
	// take the request at all (429, rate limited), so it spent none of the
	// row's budget.
	Refund bool
	// LookupPending marks a retry that must begin with a lookup
	// (StatusQueued): the attempt ended without an answer at a provider
	// without idempotency. Any other write clears it.
	LookupPending bool
	// LookupFailed counts a lookup that failed against the row's lookup
	// budget.
	LookupFailed bool
	// NotAccepted says a lookup found no message for the reference: no
	// earlier attempt reached the provider, and the row's maybe_accepted
	// mark is cleared (before this result's own MaybeAccepted is added).
	NotAccepted bool
	// Lookup, when set, is the lookup's answer, recorded as evidence in
	// the same transaction.
	Lookup *Evidence
	// Attempt and Gen are the claim's attempt number and the row's publish
	// generation it was made under: a write that misses its claim (a
	// failover lost the claim) still counts the attempt it spent
	// (countMissed), unless Refund gives it back.
	Attempt int
	Gen     int32
	// Provider names the provider this attempt's call (or lookup that
	// found the message) went to; "" when none did, or the sender's one
	// provider has no name. Every write of the result sets it on the row,
	// a write that missed its claim too: the provider that answered, or
	// may hold the message, is the row's, whatever a failover lost (the
	// claim that named it, or a move to it).
	Provider string
	// LookupEverywhere, when set, is written to the row's mark: true when
	// an attempt whose records may have been lost could not ask every
	// other provider yet, false once they all answered; nil leaves it.
	LookupEverywhere *bool
	// Suppress, when set, puts the row's number on the suppression list
	// in the same transaction, before any status is written: the provider
	// refused the call because the recipient opted out. The row's own
	// status is then StatusSuppressed (or StatusUnknown, when an earlier
	// attempt may have reached the provider). The number goes on the list
	// whether or not the status write applies.
	Suppress *Suppression
}

// Written describes a row a status write changed.
type Written struct {
	// Gen is the row's publish generation, for its dead letter's id.
	Gen int32
	// Attempts is the row's attempt count.
	Attempts int
	// Reason is the row's dead-letter reason after the write (a dead
	// result becomes unknown, ambiguous, on a row an attempt may have
	// reached the provider with): its letter's reason.
	Reason string
}

// Attempt is one record of the attempts log: a provider call, or a decision
// that finished a message without one. It never holds personal data.
type Attempt struct {
	// OutboxID is the row.
	OutboxID uuid.UUID
	// Number is the row's attempt number.
	Number int
	// StartedAt is when the attempt began.
	StartedAt time.Time
	// Latency is the provider call's wall time; zero when no call was made.
	Latency time.Duration
	// Outcome is the class: sent, retry, permanent, ambiguous, max_attempts.
	Outcome string
	// HTTPStatus and ProviderCode are the provider's answer, 0 when none.
	HTTPStatus, ProviderCode int
	// Error is the failure text, empty on success.
	Error string
	// Sender names the process that made the attempt.
	Sender string
	// Provider names the provider the attempt went to; empty when the
	// sender has one provider and no name for it.
	Provider string
	// FromRow marks a first attempt that was sent, of a row never replayed
	// or republished, which the senders do not log: Attempts describes it
	// from its row, with StartedAt the time
	// its acceptance was written (sent_at), and no latency, HTTP status or
	// sender.
	FromRow bool
}

// ApplyResults writes a batch of attempt outcomes and returns the rows whose
// write applied. Each write is guarded so it never moves a row backwards:
// sent is written over any unfinished status, over unknown (the provider's
// own answer is the evidence that settles it), and over dead (a later
// claim concluded nothing was sent, while this attempt's answer, lost to
// it, says the provider took the message: truth over the guess, as a
// receipt does); a retry, dead or
// unknown only by the claim that still holds the row (its token), which
// also makes writing the same result twice harmless (a retry after an error
// whose commit went through applies again to the row it already moved). A
// write from an attempt that was overtaken (another claim took the row, an
// operator replayed it, or a failover lost the claim) changes nothing but
// its caution: an attempt that may have reached the provider still marks an
// unfinished row (markMissed). attempts are appended to the
// attempts log in the same transaction; again says the batch may have been
// committed before (its answer was lost), and then a record already in the
// log is not added twice. Text is made safe for the database (valid UTF-8,
// no NUL) so that one hostile provider answer cannot fail the batch.
//
// Rows are updated by one statement per batch that locks them in id order,
// so two writers, or a writer and a claim, cannot deadlock.
func ApplyResults(ctx context.Context, tx pgx.Tx, results []Result, attempts []Attempt, again bool) (map[uuid.UUID]Written, error) {
	if err := insertAttempts(ctx, tx, attempts, again); err != nil {
		return nil, err
	}
	// The list first: a move into suppressed needs the number on it.
	if err := suppressRows(ctx, tx, results); err != nil {
		return nil, err
	}
	written := make(map[uuid.UUID]Written, len(results))
	// One statement updates a row once: a second result for the same row in
	// one batch (a late outcome of an overtaken attempt beside the new one)
	// goes to a statement of its own.
	rest := slices.Clone(results)
	slices.SortFunc(rest, func(a, b Result) int { return compareUUID(a.ID, b.ID) })
	for len(rest) > 0 {
		var round, later []Result
		for i, r := range rest {
			if i > 0 && r.ID == rest[i-1].ID {
				later = append(later, r)
				continue
			}
			round = append(round, r)
		}
		apply := applyRound
		if plainSends(round) {
			apply = applySends
		}
		if err := apply(ctx, tx, round, written); err != nil {
			return nil, err
		}
		rest = later
	}
	if err := requeueUnlisted(ctx, tx, results, written); err != nil {
		return nil, err
	}
	if err := markMissed(ctx, tx, results, written); err != nil {
		return nil, err
	}
	if err := refundMissed(ctx, tx, results, written); err != nil {
		return nil, err
	}
	if err := countMissed(ctx, tx, results, written); err != nil {
		return nil, err
	}
	if err := insertLookups(ctx, tx, results, again); err != nil {
		return nil, err
	}
	return written, nil
}

// requeueUnlisted puts back a row the sender decided to end suppressed
// without a call, but whose number left the list since its claim (an
// operator removed it): no call was made, and now one may be. The row
// waits in Postgres (queued, its attempt given back, no message: the
// sender acks it) and the reconciler republishes it. Only while its claim
// still holds it; the trigger's check of the list runs on a snapshot of
// its own, so a removal that commits between the write's check and the
// trigger's fails the write, which is tried again and then comes here.
func requeueUnlisted(ctx context.Context, tx pgx.Tx, results []Result, written map[uuid.UUID]Written) error {
	var ids, tokens []uuid.UUID
	for _, r := range results {
		if _, applied := written[r.ID]; r.Status == StatusSuppressed && r.Suppress == nil && !applied {
			ids, tokens = append(ids, r.ID), append(tokens, r.Token)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, _ := tx.Query(ctx, requeueUnlistedSQL, uuidArray(ids), uuidArray(tokens))
	if err := collectWritten(rows, written); err != nil {
		return fmt.Errorf("outbox: put back rows whose number left the suppression list: %w", err)
	}
	return nil
}

// refundMissed gives back the attempt of a refunded result whose write
// applied to nothing because the row moved on meanwhile (a receipt finished
// it while its claim only looked it up, or was refused with a 429): the
// claim counted an attempt that made no request. Only the claim that
// counted it gives it back (its token is still the row's).
func refundMissed(ctx context.Context, tx pgx.Tx, results []Result, written map[uuid.UUID]Written) error {
	var ids, tokens []uuid.UUID
	for _, r := range results {
		if _, applied := written[r.ID]; r.Refund && !applied {
			ids, tokens = append(ids, r.ID), append(tokens, r.Token)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, refundMissedSQL, uuidArray(ids), uuidArray(tokens))
	if err != nil {
		return fmt.Errorf("outbox: give back the attempts of missed refunds: %w", err)
	}
	return nil
}

// countMissed counts the attempt of a result whose write missed its claim,
// when the row does not count it (a failover lost the claim that did): the
// attempt was made, a call or a decision that spent it, and its record is
// in the attempts log. Only under the generation the claim was made in: a
// replay starts the count again.
func countMissed(ctx context.Context, tx pgx.Tx, results []Result, written map[uuid.UUID]Written) error {
	var (
		ids      []uuid.UUID
		attempts []int32
		gens     []int32
	)
	for _, r := range results {
		if _, applied := written[r.ID]; applied || r.Refund || r.Attempt <= 0 {
			continue
		}
		ids, attempts, gens = append(ids, r.ID), append(attempts, int32(r.Attempt)), append(gens, r.Gen)
	}
	if len(ids) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, countMissedSQL, uuidArray(ids), attempts, gens)
	if err != nil {
		return fmt.Errorf("outbox: count the attempts of missed writes: %w", err)
	}
	return nil
}

// markMissed keeps the caution of results whose fenced write applied to
// nothing. Such a write missed its claim: the lease ran out and another
// claim took the row, an operator replayed it, or a Postgres failover lost
// the claim with the old primary, so that the promoted database holds the
// row as it was before (queued, even pending, with no trace of the
// attempt). The attempt may still have reached the provider: a row that is
// not finished gets maybe_accepted and its lookup pending, and (queued or
// pending) no claim before the result's wait (the lookup's settle time) is
// over. Whoever claims the row next then
// asks the provider, or ends it unknown where the provider cannot be asked,
// instead of calling as if nothing had happened.
func markMissed(ctx context.Context, tx pgx.Tx, results []Result, written map[uuid.UUID]Written) error {
	var (
		ids     []uuid.UUID
		lookups []bool
		delays  []float64
		provs   []string
		everyw  []*bool
		marks   []bool
	)
	for _, r := range results {
		if !r.MaybeAccepted && !r.LookupPending && r.LookupEverywhere == nil {
			continue
		}
		if _, applied := written[r.ID]; applied {
			continue
		}
		ids = append(ids, r.ID)
		// The mark is the lookup's even where no lookup can be made: a
		// claim that finds it there ends the row unknown rather than call.
		lookups = append(lookups, r.LookupPending || r.MaybeAccepted)
		delays = append(delays, r.RetryIn.Seconds())
		// A result named here only for its lookup_everywhere mark leaves
		// the other marks and the due time as they are.
		marks = append(marks, r.LookupPending || r.MaybeAccepted)
		provs = append(provs, r.Provider)
		everyw = append(everyw, r.LookupEverywhere)
	}
	if len(ids) == 0 {
		return nil
	}
	// Locked in id order, as every status write is.
	_, err := tx.Exec(ctx, markMissedSQL, uuidArray(ids), lookups, delays, provs, everyw, marks)
	if err != nil {
		return fmt.Errorf("outbox: mark missed attempts: %w", err)
	}
	return nil
}

func applyRound(ctx context.Context, tx pgx.Tx, results []Result, written map[uuid.UUID]Written) error {
	n := len(results)
	var (
		ids      = make([]uuid.UUID, n)
		statuses = make([]string, n)
		refs     = make([]string, n)
		errs     = make([]string, n)
		reasons  = make([]*string, n)
		delays   = make([]float64, n)
		parks    = make([]bool, n)
		tokens   = make([]uuid.UUID, n)
		maybes   = make([]bool, n)
		refunds  = make([]bool, n)
		lookups  = make([]bool, n)
		failed   = make([]int32, n)
		notacc   = make([]bool, n)
		provs    = make([]string, n)
		everyw   = make([]*bool, n)
	)
	for i, r := range results {
		switch r.Status {
		case StatusSent, StatusDelivered, StatusUndelivered, StatusQueued, StatusDead, StatusUnknown, StatusExpired, StatusSuppressed:
		default:
			return fmt.Errorf("outbox: write results: status %q is not an attempt outcome", r.Status)
		}
		ids[i], statuses[i], tokens[i] = r.ID, string(r.Status), r.Token
		refs[i], errs[i] = clean(r.ProviderRef), clean(r.Error)
		if r.Reason != "" {
			reason := r.Reason
			reasons[i] = &reason
		}
		delays[i], parks[i], maybes[i], refunds[i] = r.RetryIn.Seconds(), r.Park, r.MaybeAccepted, r.Refund
		lookups[i], notacc[i], provs[i], everyw[i] = r.LookupPending, r.NotAccepted, r.Provider, r.LookupEverywhere
		if r.LookupFailed {
			failed[i] = 1
		}
	}
	// The rows are locked first, in id order, through the primary key (the
	// batch's ids, not a join with the unnest: a join there made Postgres
	// hash-join two sequential scans of the table); the update then finds
	// each row by its key.
	rows, _ := tx.Query(ctx, applyResultsSQL,
		uuidArray(ids), statuses, refs, errs, reasons, delays, parks, uuidArray(tokens), maybes, refunds, lookups, failed, notacc, provs, everyw)
	if err := collectWritten(rows, written); err != nil {
		return fmt.Errorf("outbox: write results: %w", err)
	}
	return nil
}

// plainSends reports whether every result is a send and nothing else
// (no lookup, mark or refund): the common batch, which applySends writes
// with a statement that carries two columns instead of thirteen.
func plainSends(results []Result) bool {
	for _, r := range results {
		if r.Status != StatusSent || r.MaybeAccepted || r.Refund || r.LookupPending || r.LookupFailed ||
			r.NotAccepted || r.Lookup != nil || r.LookupEverywhere != nil || r.Suppress != nil {
			return false
		}
	}
	return true
}

// applySends is applyRound for plain sends: the same write (what applyRound
// sets for a sent result with no lookup, mark or refund; the other columns
// keep their values), a quarter cheaper to plan and to run, measured with
// bench -only pipeline.
func applySends(ctx context.Context, tx pgx.Tx, results []Result, written map[uuid.UUID]Written) error {
	ids := make([][16]byte, len(results))
	refs := make([]string, len(results))
	var provs []string // nil when no result names a provider: the common case costs nothing more
	for i, r := range results {
		ids[i], refs[i] = r.ID, clean(r.ProviderRef)
		if r.Provider != "" && provs == nil {
			provs = make([]string, len(results))
		}
	}
	if provs != nil {
		for i, r := range results {
			provs[i] = r.Provider
		}
	}
	sql, args := applySendsSQL, []any{ids, refs}
	if provs != nil {
		sql, args = applySendsNamedSQL, append(args, provs)
	}
	rows, _ := tx.Query(ctx, sql, args...)
	if err := collectWritten(rows, written); err != nil {
		return fmt.Errorf("outbox: write sends: %w", err)
	}
	return nil
}

// applySendsSQL writes plain sends; applySendsNamedSQL also names each
// row's provider (SMS_PROVIDERS): the provider that answered is the row's.
var (
	applySendsSQL      = stmt("apply_sends")
	applySendsNamedSQL = stmt("apply_sends_named")
)

// collectWritten reads a status write's RETURNING (id, publish_gen,
// attempt_count, end_reason) into written.
func collectWritten(rows pgx.Rows, written map[uuid.UUID]Written) error {
	var (
		id       uuid.UUID
		gen      int32
		attempts int32
		reason   string
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &gen, &attempts, &reason}, func() error {
		written[id] = Written{Gen: gen, Attempts: int(attempts), Reason: reason}
		return nil
	})
	return err
}

func compareUUID(a, b uuid.UUID) int {
	return strings.Compare(string(a[:]), string(b[:]))
}

// Lettered is a row whose dead letter was stored at Seq in the dead-letter
// stream.
type Lettered struct {
	// ID and Gen are the row and the publish generation the letter ends.
	ID  uuid.UUID
	Gen int32
	// Seq is the letter's stream sequence.
	Seq uint64
}

// MarkLettered records that the rows' dead letters are stored. A row that
// moved on since (an operator replayed it: a new generation) is left alone.
func MarkLettered(ctx context.Context, q Querier, ls []Lettered) error {
	if len(ls) == 0 {
		return nil
	}
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, b Lettered) int { return compareUUID(a.ID, b.ID) })
	ids := make([]uuid.UUID, len(ls))
	gens := make([]int32, len(ls))
	seqs := make([]int64, len(ls))
	for i, l := range ls {
		ids[i], gens[i], seqs[i] = l.ID, l.Gen, int64(min(l.Seq, 1<<62))
	}
	_, err := q.Exec(ctx, markLetteredSQL,
		uuidArray(ids), gens, seqs)
	if err != nil {
		return fmt.Errorf("outbox: mark dead letters stored: %w", err)
	}
	return nil
}

// Unlettered is a dead or unknown row whose dead letter is not yet stored.
type Unlettered struct {
	ID           uuid.UUID
	Gen          int32
	Status       State
	Reason       string
	Error        string
	Attempts     int
	ProviderCode int
}

// ClaimUnlettered locks up to limit dead or unknown rows whose letter is not
// stored and whose status changed more than olderThan ago (the sender that
// finished them normally stores the letter within milliseconds), skipping
// rows another reconciler holds.
func ClaimUnlettered(ctx context.Context, tx pgx.Tx, olderThan time.Duration, limit int) ([]Unlettered, error) {
	rows, _ := tx.Query(ctx, claimUnletteredSQL, olderThan, limit)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Unlettered, error) {
		var u Unlettered
		err := r.Scan(&u.ID, &u.Gen, &u.Status, &u.Reason, &u.Error, &u.Attempts, &u.ProviderCode)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim rows without their dead letter: %w", err)
	}
	return out, nil
}

// clean makes text storable: valid UTF-8 without NUL, at most 1000 bytes.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	if len(s) > 1000 {
		s = strings.ToValidUTF8(s[:1000], "")
	}
	return s
}

// insertAttempts appends attempts to the log; with again, records already
// there (same row, attempt number and start) are skipped, and so are those
// of rows that do not exist (any more: a failover lost their insert, or
// retention purged them), which would otherwise fail the whole batch.
func insertAttempts(ctx context.Context, tx pgx.Tx, attempts []Attempt, again bool) error {
	if len(attempts) == 0 {
		return nil
	}
	n := len(attempts)
	var (
		ids      = make([]uuid.UUID, n)
		numbers  = make([]int32, n)
		started  = make([]time.Time, n)
		latency  = make([]*float64, n)
		outcomes = make([]string, n)
		statuses = make([]*int32, n)
		codes    = make([]*int32, n)
		errs     = make([]*string, n)
		senders  = make([]string, n)
		provs    = make([]*string, n)
	)
	for i, a := range attempts {
		ids[i], numbers[i], started[i], outcomes[i], senders[i] = a.OutboxID, int32(a.Number), a.StartedAt, a.Outcome, a.Sender
		if a.Latency > 0 {
			ms := float64(a.Latency) / float64(time.Millisecond)
			latency[i] = &ms
		}
		if a.HTTPStatus != 0 {
			v := int32(a.HTTPStatus)
			statuses[i] = &v
		}
		if a.ProviderCode != 0 {
			v := int32(a.ProviderCode)
			codes[i] = &v
		}
		if a.Error != "" {
			e := clean(a.Error)
			errs[i] = &e
		}
		if a.Provider != "" {
			p := a.Provider
			provs[i] = &p
		}
	}
	sql := insertAttemptsSQL
	if again {
		// One index lookup per record, as for receipts (sendonce_apply_receipts):
		// NOT EXISTS may be planned as a scan of the whole log.
		sql = insertAttemptsAgainSQL
	}
	_, err := tx.Exec(ctx, sql, uuidArray(ids), numbers, started, latency, outcomes, statuses, codes, errs, senders, provs)
	if err != nil {
		return fmt.Errorf("outbox: record attempts: %w", err)
	}
	return nil
}

// The statements of this file (sql.go).
var (
	applyResultsSQL        = stmt("apply_results")
	claimForSendSQL        = stmt("claim_for_send")
	claimUnletteredSQL     = stmt("claim_unlettered")
	countMissedSQL         = stmt("count_missed")
	handBackSQL            = stmt("hand_back")
	markLetteredSQL        = stmt("mark_lettered")
	markMissedSQL          = stmt("mark_missed")
	refundMissedSQL        = stmt("refund_missed")
	repinSQL               = stmt("repin")
	requeueUnlistedSQL     = stmt("requeue_unlisted")
	insertAttemptsSQL      = stmt("insert_attempts")
	insertAttemptsAgainSQL = stmt("insert_attempts_again")
)
