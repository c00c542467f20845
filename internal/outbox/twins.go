package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/safetext"
)

// Twin is a row that a lookup by content (Twilio's: the number and the
// text) cannot tell from the row looked up: a message the provider has may
// be the twin's.
type Twin struct {
	// ID is the row.
	ID uuid.UUID
	// Status is its status as read.
	Status State
	// ProviderRef is the provider's id of its message (Twilio's sid), as
	// the create response, a status callback or a lookup gave it; empty
	// when none did, and then any message found may be the twin's.
	ProviderRef string
}

// Twins returns the rows other than id to the number to with the same text
// as body (safetext.SameText, the lookup's comparison) that may have made a
// provider message with an attempt that started at or after since.
//
// Such a row has been claimed at or after since, and every claim stamps
// updated_at, which only moves forward: its updated_at is at or after since.
// Its status says whether an attempt may have reached the provider:
// sending (an attempt is under way, or died mid-call), queued with
// maybe_accepted (an attempt lost its answer), sent, delivered, undelivered
// or unknown. Left out: dead (the table refuses dead with maybe_accepted:
// nothing of it reached the provider), queued without maybe_accepted (no
// attempt reached it), and pending (no attempt yet; or, after an operator's
// forced replay of an unknown row, until the relay takes it, milliseconds
// but for a relay outage: the pending backlog is not indexed by
// updated_at, and reading it whole is the scan this query avoids).
//
// For the messages a lookup found, since is the earliest creation time
// among them less the longest an attempt takes (SMS_API_TIMEOUT) and the
// clocks' disagreement (provider.LookupMargin): an attempt that made a
// message created at T was claimed no earlier than that.
//
// The rows are read through the partial indexes on updated_at of their
// statuses (sms_outbox_inflight_idx, _final_idx, _dead_idx): the rows that
// changed since since in those statuses, not the table; the number and the
// text are compared on those rows. The statement is planned for its
// parameters each time (QueryExecModeExec): a generic plan cannot know how
// recent since is. The sender's role may read every column used.
func Twins(ctx context.Context, q Querier, id uuid.UUID, to, body string, since time.Time) ([]Twin, error) {
	rows, _ := q.Query(ctx, twinsSQL, pgx.QueryExecModeExec, id, to, since)
	var out []Twin
	var (
		t    Twin
		text string
	)
	_, err := pgx.ForEachRow(rows, []any{&t.ID, &t.Status, &t.ProviderRef, &text}, func() error {
		if safetext.SameText(text, body) {
			out = append(out, t)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read the rows a lookup cannot tell apart: %w", err)
	}
	return out, nil
}

// twinsSQL is Twins' statement: one branch per partial index on updated_at,
// each with its index's predicate, so that each branch reads its own range
// of its index.
var twinsSQL = stmt("twins")
