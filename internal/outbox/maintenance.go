package outbox

import (
	"context"
	"fmt"
	"time"
)

// Purge deletes up to limit finished rows (sent, dead, unknown) whose last
// change is older than age, with their attempts, and returns how many it
// deleted. Rows another purger holds are skipped, so each call locks at most
// limit rows for a few milliseconds.
func Purge(ctx context.Context, q Querier, age time.Duration, limit int) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM sms_outbox WHERE id IN (
		SELECT id FROM sms_outbox
		WHERE status IN ('sent', 'dead', 'unknown') AND updated_at < now() - $1::interval
		ORDER BY updated_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED)`, age, limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Depth is the outbox's work in progress, for monitoring.
type Depth struct {
	// Rows counts the unfinished rows by status (pending, queued, sending;
	// each present). Finished rows are not counted: that would scan the
	// whole table; the senders' counters give their rates.
	Rows map[State]int64
	// OldestPending is the age of the oldest pending row: the relay's lag.
	OldestPending time.Duration
	// OldestInFlight is the age of the least recently touched queued or
	// sending row.
	OldestInFlight time.Duration
}

// Measure reads the outbox's depth from the partial indexes on unfinished
// rows, so its cost follows the work in progress, not the table.
func Measure(ctx context.Context, q Querier) (Depth, error) {
	d := Depth{Rows: map[State]int64{}}
	for _, s := range []State{StatusPending, StatusQueued, StatusSending} {
		d.Rows[s] = 0
	}
	// Two counts whose conditions match the partial indexes' predicates
	// exactly, so each is an index scan, whatever the table's size.
	var pending, queued, sending int64
	err := q.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM sms_outbox WHERE status = 'pending'),
		(SELECT count(*) FILTER (WHERE status = 'queued') FROM sms_outbox WHERE status IN ('queued', 'sending')),
		(SELECT count(*) FILTER (WHERE status = 'sending') FROM sms_outbox WHERE status IN ('queued', 'sending'))`).
		Scan(&pending, &queued, &sending)
	if err != nil {
		return Depth{}, fmt.Errorf("outbox: count rows: %w", err)
	}
	d.Rows[StatusPending], d.Rows[StatusQueued], d.Rows[StatusSending] = pending, queued, sending
	var oldestPending, inflight *float64
	err = q.QueryRow(ctx, `SELECT
		(SELECT extract(epoch FROM now() - min(created_at)) FROM sms_outbox WHERE status = 'pending'),
		(SELECT extract(epoch FROM now() - min(updated_at)) FROM sms_outbox WHERE status IN ('queued', 'sending'))`).
		Scan(&oldestPending, &inflight)
	if err != nil {
		return Depth{}, fmt.Errorf("outbox: oldest rows: %w", err)
	}
	if oldestPending != nil {
		d.OldestPending = time.Duration(max(0, *oldestPending) * float64(time.Second))
	}
	if inflight != nil {
		d.OldestInFlight = time.Duration(max(0, *inflight) * float64(time.Second))
	}
	return d, nil
}

// OldestUrgent returns the age of the oldest urgent row not yet sent
// (pending, queued or sending), zero when there is none. It reads only the
// partial index of urgent rows in flight, so a bulk backlog costs it
// nothing.
func OldestUrgent(ctx context.Context, q Querier) (time.Duration, error) {
	var age *float64
	err := q.QueryRow(ctx, `SELECT extract(epoch FROM now() - min(created_at)) FROM sms_outbox
		WHERE priority = 1 AND status IN ('pending', 'queued', 'sending')`).Scan(&age)
	if err != nil {
		return 0, fmt.Errorf("outbox: oldest urgent row: %w", err)
	}
	if age == nil {
		return 0, nil
	}
	return time.Duration(max(0, *age) * float64(time.Second)), nil
}
