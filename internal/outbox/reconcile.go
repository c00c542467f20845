package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Stuck is a row the reconciler found in flight for too long.
type Stuck struct {
	// ID is the row id.
	ID uuid.UUID
	// Status is queued or sending.
	Status State
	// Gen is the row's current publish generation.
	Gen int32
	// Attempts and MaxAttempts are the attempts made and allowed.
	Attempts, MaxAttempts int
	// MaybeAccepted is set when an attempt may have reached the provider
	// without an answer saying it failed.
	MaybeAccepted bool
	// Priority is the row's priority: its lane.
	Priority int16
	// LookupPending is set when the row's last attempt ended without an
	// answer (or its write missed its claim): the provider is to be asked
	// before anything else.
	LookupPending bool
	// Traceparent is the W3C Trace Context the row was enqueued in; "" when
	// none.
	Traceparent string
}

// Spent reports whether the row has no attempt left.
func (s Stuck) Spent() bool { return s.Attempts >= s.MaxAttempts }

// ClaimStuck locks up to limit rows that no message will move any more, in
// tx, skipping rows another reconciler holds:
//   - queued rows parked in Postgres (a sender acked their message and left
//     them to wait for a long retry; stream_seq is NULL) once they are due;
//   - queued rows whose retry time passed more than grace ago, whose current
//     publication their lane's consumer is done with (stream_seq at or below
//     done[priority], its ack floor: a row behind it in a backlog is only
//     waiting), and not touched for grace;
//   - sending rows whose claim's lease ran out more than grace ago: the
//     attempt died and no redelivery came to take the expired lease over.
//
// grace must exceed the consumer's AckWait, or live work is republished
// (harmless, the senders' claim deduplicates, but wasteful). The lease is
// each claim's own, stamped in the row by the database clock, so grace need
// not know the senders' lease setting.
//
// A row whose stream_seq is beyond lastSeq belongs to a stream that was lost
// and recreated (its sequences started again): it is stuck too.
//
// done holds the ack floor (the stream sequence up to which every message
// was acked, terminated or ran out of deliveries) of the urgent, normal and
// bulk lanes' consumers, in that order.
func ClaimStuck(ctx context.Context, tx pgx.Tx, grace time.Duration, done [3]uint64, lastSeq uint64, limit int) ([]Stuck, error) {
	seq := func(s uint64) int64 { return int64(min(s, 1<<62)) }
	rows, _ := tx.Query(ctx, claimStuckSQL, grace, seq(done[0]), limit, seq(lastSeq), seq(done[1]), seq(done[2]))
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stuck, error) {
		var s Stuck
		err := r.Scan(&s.ID, &s.Status, &s.Gen, &s.Attempts, &s.MaxAttempts, &s.MaybeAccepted, &s.Priority, &s.LookupPending, &s.Traceparent)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim stuck rows: %w", err)
	}
	return out, nil
}

// MarkRepublished records a republication of a stuck row under publish
// generation gen at stream sequence seq. A queued row's clock restarts; a
// sending row keeps its stale lease (so that the next claim knows the earlier
// attempt's outcome is unknown), and its retry time moves to now, which keeps
// the reconciler off it for another grace period.
func MarkRepublished(ctx context.Context, tx pgx.Tx, id uuid.UUID, gen int32, seq uint64) error {
	_, err := tx.Exec(ctx, markRepublishedSQL, id, gen, int64(seq))
	if err != nil {
		return fmt.Errorf("outbox: mark republished: %w", err)
	}
	return nil
}

// Finalize ends a stuck row whose attempts are spent with status (dead or
// unknown), dead-letter reason and error text, and records the decision in
// the attempts log. The row's dead letter is then published (and recorded
// with MarkLettered) after the transaction commits; until it is, the row is
// among those ClaimUnlettered finds.
func Finalize(ctx context.Context, tx pgx.Tx, s Stuck, status State, reason, msg string) error {
	tag, err := tx.Exec(ctx, finalizeStuckSQL, s.ID, string(status), reason, msg)
	if err != nil {
		return fmt.Errorf("outbox: finalize stuck row: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	return insertAttempts(ctx, tx, []Attempt{{
		OutboxID: s.ID, Number: s.Attempts, StartedAt: time.Now(), Outcome: reason, Error: msg, Sender: "reconciler",
	}}, false)
}

// The statements of this file (sql.go).
var (
	claimStuckSQL      = stmt("claim_stuck")
	finalizeStuckSQL   = stmt("finalize_stuck")
	markRepublishedSQL = stmt("mark_republished")
)
