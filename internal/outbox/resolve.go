package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// UnknownRow is an unknown row as relay resolve looks it up: the number and
// the body identify it at a provider that keeps no reference (Twilio).
type UnknownRow struct {
	ID        uuid.UUID
	Gen       int32
	To, Body  string
	CreatedAt time.Time
	// Settled: the row has been unknown for at least the settle time asked,
	// so that a request the provider accepted shows in its lookup.
	Settled bool
}

// UnknownRows returns up to limit unknown rows, the oldest change first, or
// only row id when id is not uuid.Nil. settle marks those unknown for at
// least that long. The number and the body are read only when content is
// set (a lookup at a provider that keeps no reference needs them; the
// relay's role may not read them).
func UnknownRows(ctx context.Context, q Querier, id uuid.UUID, settle time.Duration, limit int, content bool) ([]UnknownRow, error) {
	cols := `'', ''`
	if content {
		cols = `to_e164, body`
	}
	rows, _ := q.Query(ctx, `SELECT id, publish_gen, `+cols+`, created_at, updated_at <= now() - $3::interval
		FROM sms_outbox
		WHERE status = 'unknown' AND ($1::uuid IS NULL OR id = $1)
		ORDER BY updated_at
		LIMIT $2`, nullUUID(id), limit, settle)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnknownRow, error) {
		var u UnknownRow
		err := r.Scan(&u.ID, &u.Gen, &u.To, &u.Body, &u.CreatedAt, &u.Settled)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read unknown rows: %w", err)
	}
	return out, nil
}

func nullUUID(id uuid.UUID) *uuid.UUID {
	if id == uuid.Nil {
		return nil
	}
	return &id
}

// Settlement is what a lookup settles an unknown row to: StatusSent,
// StatusDelivered or StatusUndelivered with the provider's id (it has the
// message), or StatusDead (it has none: nothing reached it). An empty
// Status records the lookup and leaves the row unknown (several messages,
// or the lookup failed).
type Settlement struct {
	Status      State
	ProviderRef string
	// Lookup is the lookup's answer, recorded as evidence.
	Lookup Evidence
}

// Settle records a lookup of unknown row id and moves the row as s says,
// provided it is still unknown in generation gen (nobody replayed or
// settled it meanwhile); it reports whether the row moved. A row settled
// dead loses its maybe-accepted mark (the provider has no message for it)
// and keeps its dead letter, which may now replay it.
func Settle(ctx context.Context, tx pgx.Tx, id uuid.UUID, gen int32, s Settlement) (bool, error) {
	if err := insertLookups(ctx, tx, []Result{{ID: id, Lookup: &s.Lookup}}, false); err != nil {
		return false, err
	}
	if s.Status == "" {
		_, err := tx.Exec(ctx, `UPDATE sms_outbox SET last_error = $3, updated_at = clock_timestamp()
			WHERE id = $1 AND publish_gen = $2 AND status = 'unknown'`, id, gen, clean(s.Lookup.Detail))
		if err != nil {
			return false, fmt.Errorf("outbox: settle %s: %w", id, err)
		}
		return false, nil
	}
	switch s.Status {
	case StatusSent, StatusDelivered, StatusUndelivered, StatusDead:
	default:
		return false, fmt.Errorf("outbox: settle %s: status %q is not sent, delivered, undelivered or dead", id, s.Status)
	}
	tag, err := tx.Exec(ctx, `UPDATE sms_outbox
		SET status = $3,
		    provider_ref = coalesce(nullif($4, ''), provider_ref),
		    maybe_accepted = CASE WHEN $3 = 'dead' THEN false ELSE maybe_accepted END,
		    last_error = CASE WHEN $3 = 'dead' THEN $5 END,
		    lookup_pending = false,
		    sent_at = CASE WHEN $3 = 'dead' THEN sent_at ELSE coalesce(sent_at, clock_timestamp()) END,
		    updated_at = clock_timestamp()
		WHERE id = $1 AND publish_gen = $2 AND status = 'unknown'`,
		id, gen, string(s.Status), clean(s.ProviderRef), clean(s.Lookup.Detail))
	if err != nil {
		return false, fmt.Errorf("outbox: settle %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}
