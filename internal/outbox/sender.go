package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ClaimResult says what a sender found when it claimed a row for one attempt.
type ClaimResult int

// The results of ClaimForSend, one per requested id.
const (
	// Claimed: the row is now sending and the attempt may call the provider.
	Claimed ClaimResult = iota + 1
	// ClaimedStale: as Claimed, but the row was found sending with an expired
	// lease: an earlier attempt died mid-call and its outcome is unknown.
	ClaimedStale
	// AlreadyTerminal: the row is sent, dead or unknown; ack and skip.
	AlreadyTerminal
	// Leased: another attempt holds a live lease (a concurrent delivery of
	// the same row), or the row waits for its retry time (a second copy of
	// its message); back off for LeaseLeft without calling the provider.
	Leased
	// NotFound: no row has this id; the message did not come from the relay.
	NotFound
)

// Claim is one row as a sender's claim found it.
type Claim struct {
	// ID is the row id and idempotency key.
	ID uuid.UUID
	// Result is what the claim found.
	Result ClaimResult
	// Prev is the status before the claim.
	Prev State
	// To and Body are the message (set when claimed).
	To, Body string
	// Attempt is the number of this attempt, counting from 1 (set when
	// claimed; the claim increments attempt_count).
	Attempt int
	// MaxAttempts is the row's attempt budget.
	MaxAttempts int
	// Gen is the row's publish generation.
	Gen int32
	// Lease is the lease the claim took: the updated_at it stamped. Only a
	// claim or a replay changes it while the row is unfinished, so with
	// Attempt it names this attempt (set when claimed).
	Lease time.Time
	// CreatedAt is the row's insert time, for commit-to-sent latency.
	CreatedAt time.Time
	// LeaseLeft is how long a live lease still runs (set when Leased).
	LeaseLeft time.Duration
	// MaybeAccepted is set when an earlier attempt, or the attempt this
	// stale claim takes over, may have reached the provider: if the budget
	// runs out, the row ends unknown rather than dead (set when claimed).
	MaybeAccepted bool
}

// ClaimForSend claims the rows ids for one provider attempt each and returns
// one Claim per distinct id, in no particular order. A row is claimed from
// pending (the relay's commit may lose the race with the delivery), queued
// once its next_attempt_at is due (within a second, for clock skew), or
// sending with a lease older than lease; claiming sets it sending,
// increments attempt_count and renews the lease. Rows are locked in id order,
// so concurrent claims of overlapping sets cannot deadlock; a row the relay
// still holds is waited for, and then seen as queued.
func ClaimForSend(ctx context.Context, q Querier, ids []uuid.UUID, lease time.Duration) ([]Claim, error) {
	rows, _ := q.Query(ctx, `
WITH want AS (
	SELECT DISTINCT unnest($1::uuid[]) AS id
), cur AS (
	SELECT o.id, o.status, o.updated_at, o.next_attempt_at
	FROM sms_outbox o JOIN want USING (id)
	ORDER BY o.id
	FOR UPDATE OF o
), upd AS (
	UPDATE sms_outbox o
	SET status = 'sending', attempt_count = o.attempt_count + 1, updated_at = now(),
	    maybe_accepted = o.maybe_accepted OR cur.status = 'sending'
	FROM cur
	WHERE o.id = cur.id
	  AND (cur.status = 'pending'
	       OR (cur.status = 'queued' AND cur.next_attempt_at <= now() + interval '1 second')
	       OR (cur.status = 'sending' AND cur.updated_at <= now() - $2::interval))
	RETURNING o.id, o.to_e164, o.body, o.attempt_count, o.max_attempts, o.publish_gen, o.created_at, o.maybe_accepted, o.updated_at
)
SELECT want.id, cur.status, cur.updated_at, cur.next_attempt_at, upd.id IS NOT NULL,
       upd.to_e164, upd.body, upd.attempt_count, upd.max_attempts, upd.publish_gen, upd.created_at,
       coalesce(upd.maybe_accepted, false), upd.updated_at, now()
FROM want
LEFT JOIN cur ON cur.id = want.id
LEFT JOIN upd ON upd.id = want.id`, uuidArray(ids), lease)
	claims, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claim, error) {
		var (
			c         Claim
			prev      *string
			touched   *time.Time
			due       *time.Time
			claimed   bool
			to, body  *string
			attempt   *int32
			maxAtt    *int32
			gen       *int32
			createdAt *time.Time
			leaseAt   *time.Time
			now       time.Time
		)
		if err := r.Scan(&c.ID, &prev, &touched, &due, &claimed, &to, &body, &attempt, &maxAtt, &gen, &createdAt, &c.MaybeAccepted, &leaseAt, &now); err != nil {
			return c, err
		}
		switch {
		case prev == nil:
			c.Result = NotFound
			return c, nil
		case claimed:
			c.Prev = State(*prev)
			c.Result = Claimed
			if c.Prev == StatusSending {
				c.Result = ClaimedStale
			}
			c.To, c.Body = *to, *body
			c.Attempt, c.MaxAttempts, c.Gen = int(*attempt), int(*maxAtt), *gen
			c.CreatedAt, c.Lease = *createdAt, *leaseAt
		default:
			c.Prev = State(*prev)
			if c.Prev.Terminal() {
				c.Result = AlreadyTerminal
			} else {
				c.Result = Leased
				if c.Prev == StatusQueued {
					c.LeaseLeft = max(0, due.Sub(now))
				} else {
					c.LeaseLeft = max(0, touched.Add(lease).Sub(now))
				}
			}
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim rows for sending: %w", err)
	}
	return claims, nil
}

// Result is the outcome of one attempt, to be written to its row.
type Result struct {
	// ID is the row id.
	ID uuid.UUID
	// Status is the row's new status: StatusSent, StatusQueued (a retry),
	// StatusDead or StatusUnknown.
	Status State
	// ProviderRef is the provider's message id (StatusSent).
	ProviderRef string
	// Error is the failure, without personal data (other statuses).
	Error string
	// RetryAt is when the next attempt is due (StatusQueued).
	RetryAt time.Time
	// Attempt and Lease are the attempt's claim's (Claim.Attempt and
	// Claim.Lease): they fence retry, dead and unknown writes, so that an
	// overtaken attempt changes nothing, nor one from before a replay (which
	// counts attempts from zero again). A republication by the reconciler
	// keeps the lease, so a slow attempt it overlapped still writes.
	Attempt int
	Lease   time.Time
	// MaybeAccepted marks a retry whose attempt may have reached the
	// provider; it sets the row's sticky maybe_accepted (StatusQueued).
	MaybeAccepted bool
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
}

// ApplyResults writes a batch of attempt outcomes in three statements and
// returns the ids whose write applied. Each write is guarded so it never
// moves a row backwards: sent is written over any non-terminal status (the
// provider accepted, whatever else happened); a retry, dead or unknown only
// by the attempt that still owns the row: the row is sending and its
// attempt_count is the result's Attempt. A write from an attempt that was
// overtaken (its lease expired and another attempt claimed the row, or an
// operator replayed it) changes nothing. attempts are appended to the
// attempts log in the same transaction. Text is made safe for the database
// (valid UTF-8, no NUL) so that one hostile provider answer cannot fail the
// batch.
func ApplyResults(ctx context.Context, tx pgx.Tx, results []Result, attempts []Attempt) (map[uuid.UUID]bool, error) {
	if err := insertAttempts(ctx, tx, attempts); err != nil {
		return nil, err
	}
	var (
		sentIDs, retryIDs, endIDs []uuid.UUID
		refs, retryErrs, endErrs  []string
		retryAt                   []time.Time
		retryAtt, endAtt          []int32
		retryLease, endLease      []time.Time
		retryMaybe                []bool
		endStatus                 []string
	)
	for _, r := range results {
		switch r.Status {
		case StatusSent:
			sentIDs = append(sentIDs, r.ID)
			refs = append(refs, clean(r.ProviderRef))
		case StatusQueued:
			retryIDs = append(retryIDs, r.ID)
			retryErrs = append(retryErrs, clean(r.Error))
			retryAt = append(retryAt, r.RetryAt)
			retryAtt = append(retryAtt, int32(r.Attempt))
			retryLease = append(retryLease, r.Lease)
			retryMaybe = append(retryMaybe, r.MaybeAccepted)
		case StatusDead, StatusUnknown:
			endIDs = append(endIDs, r.ID)
			endErrs = append(endErrs, clean(r.Error))
			endStatus = append(endStatus, string(r.Status))
			endAtt = append(endAtt, int32(r.Attempt))
			endLease = append(endLease, r.Lease)
		default:
			return nil, fmt.Errorf("outbox: write results: status %q is not an attempt outcome", r.Status)
		}
	}
	applied := make(map[uuid.UUID]bool, len(results))
	collect := func(what, sql string, args ...any) error {
		rows, _ := tx.Query(ctx, sql, args...)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("outbox: write %s: %w", what, err)
		}
		for _, id := range ids {
			applied[id] = true
		}
		return nil
	}
	if len(sentIDs) > 0 {
		if err := collect("sent", `UPDATE sms_outbox o
			SET status = 'sent', provider_ref = v.ref, last_error = NULL, updated_at = now()
			FROM unnest($1::uuid[], $2::text[]) AS v(id, ref)
			WHERE o.id = v.id AND o.status IN ('pending', 'queued', 'sending')
			RETURNING o.id`, uuidArray(sentIDs), refs); err != nil {
			return nil, err
		}
	}
	if len(retryIDs) > 0 {
		if err := collect("retries", `UPDATE sms_outbox o
			SET status = 'queued', last_error = v.err, next_attempt_at = v.at, updated_at = now(),
			    maybe_accepted = o.maybe_accepted OR v.maybe
			FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::int[], $5::bool[], $6::timestamptz[]) AS v(id, err, at, attempt, maybe, lease)
			WHERE o.id = v.id AND o.status = 'sending' AND o.attempt_count = v.attempt AND o.updated_at = v.lease
			RETURNING o.id`, uuidArray(retryIDs), retryErrs, retryAt, retryAtt, retryMaybe, retryLease); err != nil {
			return nil, err
		}
	}
	if len(endIDs) > 0 {
		if err := collect("dead and unknown", `UPDATE sms_outbox o
			SET status = v.status, last_error = v.err, updated_at = now()
			FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::timestamptz[]) AS v(id, status, err, attempt, lease)
			WHERE o.id = v.id AND o.status = 'sending' AND o.attempt_count = v.attempt AND o.updated_at = v.lease
			RETURNING o.id`, uuidArray(endIDs), endStatus, endErrs, endAtt, endLease); err != nil {
			return nil, err
		}
	}
	return applied, nil
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

func insertAttempts(ctx context.Context, tx pgx.Tx, attempts []Attempt) error {
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
	}
	_, err := tx.Exec(ctx, `INSERT INTO sms_attempts
		(outbox_id, attempt, started_at, latency_ms, outcome, http_status, provider_code, error, sender)
		SELECT * FROM unnest($1::uuid[], $2::int[], $3::timestamptz[], $4::float8[], $5::text[],
		                     $6::int[], $7::int[], $8::text[], $9::text[])`,
		uuidArray(ids), numbers, started, latency, outcomes, statuses, codes, errs, senders)
	if err != nil {
		return fmt.Errorf("outbox: record attempts: %w", err)
	}
	return nil
}
