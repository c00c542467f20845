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
	// FirstAttempt is when the row's first attempt began: the oldest call
	// in the attempts log, of any generation, when that is attempt 1; else
	// (the first attempt went unlogged: its sender died mid-call) the
	// row's insert, which no attempt precedes.
	FirstAttempt time.Time
	// Settled: the row has been unknown for at least the settle time asked,
	// so that a request the provider accepted shows in its lookup.
	Settled bool
	// BeyondRetention: the first attempt is older than the provider's
	// lookup retention asked, so that what it sent may no longer show.
	BeyondRetention bool
	// Provider is the provider the row belongs to; "" when it names none.
	Provider string
}

// UnknownQuery selects the unknown rows relay resolve looks up.
type UnknownQuery struct {
	// ID selects one row; uuid.Nil selects up to Limit rows, the oldest
	// change first.
	ID    uuid.UUID
	Limit int
	// Settle marks the rows unknown for at least that long (Settled).
	Settle time.Duration
	// Retention marks the rows whose first attempt is older than that
	// (BeyondRetention).
	Retention time.Duration
	// Content reads the number and the body: a lookup at a provider that
	// keeps no reference needs them, and the relay's role may not read
	// them.
	Content bool
}

// UnknownRows returns the unknown rows q selects, their times judged by the
// database's clock.
func UnknownRows(ctx context.Context, db Querier, q UnknownQuery) ([]UnknownRow, error) {
	sql := unknownRowsSQL
	if q.Content {
		sql = unknownRowsWithContentSQL
	}
	rows, _ := db.Query(ctx, sql, nullUUID(q.ID), q.Limit, q.Settle, q.Retention)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnknownRow, error) {
		var u UnknownRow
		err := r.Scan(&u.ID, &u.Gen, &u.To, &u.Body, &u.CreatedAt, &u.FirstAttempt, &u.Settled, &u.BeyondRetention, &u.Provider)
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
		_, err := tx.Exec(ctx, noteUnsettledSQL, id, gen, clean(s.Lookup.Detail))
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
	tag, err := tx.Exec(ctx, settleUnknownSQL,
		id, gen, string(s.Status), clean(s.ProviderRef), clean(s.Lookup.Detail))
	if err != nil {
		return false, fmt.Errorf("outbox: settle %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// The statements of this file (sql.go).
var (
	noteUnsettledSQL = stmt("note_unsettled")
	settleUnknownSQL = stmt("settle_unknown")
)

// unknownRowsSQL reads the unknown rows without their number and body, as
// the relay's role may; unknownRowsWithContentSQL with them, for a lookup
// at a provider that keeps no reference.
var (
	unknownRowsSQL            = fill(stmt("unknown_rows"), "columns", unknownRowsColumns)
	unknownRowsWithContentSQL = fill(stmt("unknown_rows"), "columns", unknownRowsContent)
)

// The fills of unknown_rows.sql's {{columns}}.
const (
	unknownRowsColumns = `'' AS to_e164, '' AS body`
	unknownRowsContent = `o.to_e164, o.body`
)
