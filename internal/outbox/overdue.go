package outbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Receipts overdue: the statements of the senders' sweep of sent rows whose
// delivery receipt has not come (internal/sender, ReceiptSweep), and the
// relay's measure of its backlog.
//
// A sent row whose receipt is overdue is marked: lookup_pending set (which
// no other writer sets on a sent row: a sent row is never claimed for
// sending), lookups counting its looks from 0, next_attempt_at when the
// next look is due. The partial index sms_outbox_overdue_idx (migration
// 0016) holds the marked rows only, so that a message whose receipt comes,
// as nearly all do, never pays for an entry. A receipt clears the mark with
// the status it writes; so does the sweep's last look. The marks leave
// updated_at alone: it stays the time the row was sent, the row keeps its
// place in sms_outbox_final_idx, and retention purges it as before.

// markOverdueSQL marks the sent rows among the next $3 entries of
// sms_outbox_final_idx whose updated_at is at least the later of $1 and
// now() less the overdue time $2 and the catch-up $4, and at most now()
// less $2; $5 false leaves out the rows without a provider id. The entries
// are read by an index-only scan (the status is included in the index),
// and only the sent ones' rows are fetched, by their updated_at through the
// same index: a chunk of delivered rows costs no heap access. A row another
// transaction holds is skipped: whoever holds a sent row moves it on
// (a receipt) or marks it (another sweep).
var markOverdueSQL = stmt("mark_overdue")

// OverdueScan is what one chunk of the overdue scan read and did.
type OverdueScan struct {
	// Read is how many index entries (final rows) the chunk read; Last is
	// the updated_at of the last of them (zero when none).
	Read int
	Last time.Time
	// Upto is the end of the range: now less the overdue time, by the
	// database's clock.
	Upto time.Time
	// Marked is how many sent rows it marked overdue.
	Marked int
}

// MarkOverdue reads the next limit final rows (sent, delivered,
// undelivered, dead) in the order of their last change, from the later of
// from and now less overdue and catchUp, up to now less overdue (by the
// database's clock), and marks the sent ones among them overdue: their
// lookups are due now (ClaimOverdue). withoutRef false leaves out the sent
// rows without a provider id (a lookup by content cannot tell their message
// from another row's with the same text). A row marked already, or held by
// another transaction, is left alone.
//
// The caller keeps the position: the next chunk starts at Last when the
// chunk read limit entries (entries of the same time as Last are read
// again, and marked once), else at Upto. Each chunk reads at most limit
// entries of the index, whatever the table holds, so a scan that follows
// the overdue time reads each final row once.
func MarkOverdue(ctx context.Context, q Querier, from time.Time, overdue, catchUp time.Duration, limit int, withoutRef bool) (OverdueScan, error) {
	var (
		s    OverdueScan
		last *time.Time
	)
	err := q.QueryRow(ctx, markOverdueSQL, from, overdue, limit, catchUp, withoutRef).Scan(&s.Read, &last, &s.Upto, &s.Marked)
	if err != nil {
		return OverdueScan{}, fmt.Errorf("outbox: mark rows with overdue receipts: %w", err)
	}
	if last != nil {
		s.Last = *last
	}
	return s, nil
}

// OverdueRow is a sent row whose receipt is overdue, claimed for one look.
type OverdueRow struct {
	// ID is the row and the reference its message was sent with.
	ID uuid.UUID
	// To and Body identify the message where the provider keeps no
	// reference (Twilio).
	To, Body string
	// ProviderRef is the provider's id for the message, "" when the row
	// has none.
	ProviderRef string
	// CreatedAt is the row's insert; SentAt its updated_at, which the marks
	// leave alone: when it became sent.
	CreatedAt, SentAt time.Time
	// Look is this look's number, from 1.
	Look int
	// Provider is the provider the row belongs to; "" when it names none.
	Provider string
}

// claimOverdueSQL claims up to $1 marked rows whose look is due, through
// the first entries of sms_outbox_overdue_idx, and schedules each one's
// next look: $2 the delays in seconds by look, $3 the least delay.
var claimOverdueSQL = stmt("claim_overdue")

// ClaimOverdue claims up to limit marked rows whose next look is due, the
// longest due first, skipping rows another transaction holds. Claiming is
// taking the look: it counts it (lookups) and moves the row's next look to
// after the delay schedule gives for it (schedule[n-1] after look n; its
// last element after every later one), and at least hold from now, so that
// no other sweep takes the row while this one looks it up (hold covers the
// looks of the batch). A look that settles nothing needs no other write,
// and one that never happens (the process died) happens at the next one.
func ClaimOverdue(ctx context.Context, q Querier, limit int, schedule []time.Duration, hold time.Duration) ([]OverdueRow, error) {
	if len(schedule) == 0 {
		return nil, fmt.Errorf("outbox: claim rows with overdue receipts: an empty schedule")
	}
	secs := make([]float64, len(schedule))
	for i, d := range schedule {
		secs[i] = d.Seconds()
	}
	rows, _ := q.Query(ctx, claimOverdueSQL, limit, secs, hold.Seconds())
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OverdueRow, error) {
		var (
			o    OverdueRow
			look int16
		)
		err := r.Scan(&o.ID, &o.To, &o.Body, &o.ProviderRef, &o.CreatedAt, &o.SentAt, &look, &o.Provider)
		o.Look = int(look)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim rows with overdue receipts: %w", err)
	}
	return out, nil
}

// ReleaseOverdue gives the looks of rows claimed and not looked up back
// (the sweep is stopping): they are due again now.
func ReleaseOverdue(ctx context.Context, q Querier, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, releaseOverdueSQL, uuidArray(ids))
	if err != nil {
		return fmt.Errorf("outbox: release rows with overdue receipts: %w", err)
	}
	return nil
}

// OverdueLook is what one look at a row with an overdue receipt learned.
type OverdueLook struct {
	// ID is the row.
	ID uuid.UUID
	// Fate is StatusDelivered or StatusUndelivered when the lookup found
	// the row's own message with that fate; "" when it settled nothing.
	Fate State
	// ProviderRef is the id of the row's message the lookup found, kept
	// when the row has none.
	ProviderRef string
	// Last marks the row's last look: a row it does not settle leaves the
	// sweep (its mark is cleared) and stays sent.
	Last bool
	// Lookup is the lookup's answer, recorded as evidence.
	Lookup Evidence
}

// OverdueWritten says what RecordOverdueLooks did.
type OverdueWritten struct {
	// Settled are the rows moved to their fate.
	Settled []uuid.UUID
	// GaveUp are the rows whose looks ran out while still sent.
	GaveUp []uuid.UUID
}

// RecordOverdueLooks records the looks as evidence and moves each row whose
// look found its fate there, forward only: a row that is no longer sent (a
// receipt came meanwhile) keeps its status, and its look is only recorded.
// A row's last look that settled nothing clears its mark. Rows are locked in
// id order, as every other writer locks them; rows that are gone (retention
// purged them meanwhile) are left out.
func RecordOverdueLooks(ctx context.Context, tx pgx.Tx, looks []OverdueLook) (OverdueWritten, error) {
	var w OverdueWritten
	if len(looks) == 0 {
		return w, nil
	}
	looks = slices.Clone(looks)
	slices.SortFunc(looks, func(a, b OverdueLook) int { return compareUUID(a.ID, b.ID) })
	looks = slices.CompactFunc(looks, func(a, b OverdueLook) bool { return a.ID == b.ID })
	n := len(looks)
	var (
		ids     = make([]uuid.UUID, n)
		fates   = make([]string, n)
		refs    = make([]string, n)
		last    = make([]bool, n)
		results = make([]string, n)
		evRefs  = make([]*string, n)
		details = make([]string, n)
		at      = make([]time.Time, n)
		sources = make([]string, n)
	)
	for i, l := range looks {
		switch l.Fate {
		case "", StatusDelivered, StatusUndelivered:
		default:
			return w, fmt.Errorf("outbox: record overdue looks: fate %q is not delivered or undelivered", l.Fate)
		}
		ids[i], fates[i], refs[i], last[i] = l.ID, string(l.Fate), clean(l.ProviderRef), l.Last
		results[i], details[i], at[i], sources[i] = l.Lookup.Result, clean(l.Lookup.Detail), l.Lookup.ReceivedAt, l.Lookup.Source
		if r := clean(l.Lookup.ProviderRef); r != "" {
			evRefs[i] = &r
		}
	}
	rows, _ := tx.Query(ctx, recordOverdueLooksSQL, uuidArray(ids), fates, refs, last)
	var (
		id     uuid.UUID
		status string
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error {
		if status == string(StatusSent) {
			w.GaveUp = append(w.GaveUp, id)
		} else {
			w.Settled = append(w.Settled, id)
		}
		return nil
	})
	if err != nil {
		return OverdueWritten{}, fmt.Errorf("outbox: record overdue looks: %w", err)
	}
	_, err = tx.Exec(ctx, insertOverdueLookupsSQL, uuidArray(ids), results, evRefs, details, at, sources)
	if err != nil {
		return OverdueWritten{}, fmt.Errorf("outbox: record overdue lookups: %w", err)
	}
	return w, nil
}

// overdueBacklogSQL counts the marked rows, reading at most $1 entries of
// sms_outbox_overdue_idx (index-only: the send time is included), and the
// age of the oldest of those it read.
var overdueBacklogSQL = stmt("overdue_backlog")

// OverdueBacklog returns how many sent rows are marked with an overdue
// receipt (the senders' sweep is still looking them up), counting at most
// limit of them, and the time since the oldest of those counted was sent
// (0 when none). Below limit both are exact; at limit the count means
// "limit or more" and the age is that of the oldest row among those read.
// Its cost is bounded by limit, however large the backlog.
func OverdueBacklog(ctx context.Context, q Querier, limit int) (int64, time.Duration, error) {
	var (
		n    int64
		secs *float64
	)
	if err := q.QueryRow(ctx, overdueBacklogSQL, limit).Scan(&n, &secs); err != nil {
		return 0, 0, fmt.Errorf("outbox: rows with overdue receipts: %w", err)
	}
	if secs == nil {
		return n, 0, nil
	}
	return n, time.Duration(max(0, *secs) * float64(time.Second)), nil
}

// The statements of this file (sql.go).
var (
	insertOverdueLookupsSQL = stmt("insert_overdue_lookups")
	recordOverdueLooksSQL   = stmt("record_overdue_looks")
	releaseOverdueSQL       = stmt("release_overdue")
)
