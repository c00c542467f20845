package outbox

import (
	"context"
	"fmt"
)

// The relay's statements for time: scheduled rows that come due, and rows
// that reach their expiry unclaimed (migration 0030).

// PromoteDue makes up to limit scheduled rows whose send_at has come
// pending, the earliest first, skipping rows another relay holds; a row
// whose expiry came too (the relays were down past both) ends expired
// instead, never called. It returns how many became pending and how many
// expired. Reads the first entries of sms_outbox_scheduled_idx.
func PromoteDue(ctx context.Context, q Querier, limit int) (pending, expired int64, err error) {
	err = q.QueryRow(ctx, promoteDueSQL, limit).Scan(&pending, &expired)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: promote due scheduled rows: %w", err)
	}
	return pending, expired, nil
}

// ExpireDue ends up to limit rows that reached their expires_at while no
// sender held them (scheduled, pending or queued), for which no attempt
// was ever counted (attempt_count 0, which the relay cannot write) and
// that nothing marks as possibly taken (maybe_accepted, a lookup pending
// or owed to every provider): expired, never called. Any other row is left
// for its next claim, which ends it expired or settles it by evidence. Skips rows
// another relay or a sender holds; reads sms_outbox_expiring_idx. It
// returns how many rows it ended.
func ExpireDue(ctx context.Context, q Querier, limit int) (int64, error) {
	tag, err := q.Exec(ctx, expireDueSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: expire rows past their expiry: %w", err)
	}
	return tag.RowsAffected(), nil
}

// dueScheduledSQL and dueExpiringSQL pick (and lock, skipping what another
// relay or a sender holds) the rows a pass moves: the first entries of
// sms_outbox_scheduled_idx and sms_outbox_expiring_idx up to now.
// statement_timestamp() (stable) bounds each index scan to the due
// entries; clock_timestamp() (volatile) made Postgres read every entry and
// row page at each pass (a million scheduled rows: 1.4 s a pass, four a
// second). A row that comes due during the statement waits for the next
// pass.
var (
	dueScheduledSQL = stmt("due_scheduled")
	dueExpiringSQL  = stmt("due_expiring")
)

// promoteDueSQL and expireDueSQL are PromoteDue's and ExpireDue's
// statements, each around its pick of the due rows, composed once here.
var (
	promoteDueSQL = fill(stmt("promote_due"), "due", dueScheduledSQL)
	expireDueSQL  = fill(stmt("expire_due"), "due", dueExpiringSQL)
)
