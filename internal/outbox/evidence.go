package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/safetext"
)

// Receipt is a provider's report of what became of a message.
type Receipt struct {
	// ID is the row: the reference the message was sent with.
	ID uuid.UUID
	// Status is what the report establishes: StatusDelivered or
	// StatusUndelivered (the phone's fate), or StatusSent (the provider has
	// the message; evidence of acceptance only).
	Status State
	// ProviderRef is the provider's id for the message, when given.
	ProviderRef string
	// Code is the provider's error code for an undelivered message, 0 when
	// none.
	Code int
	// At is when the provider says it happened; zero when it does not say.
	At time.Time
	// Source names the receipt's kind: "generic", "twilio", "vonage",
	// "sinch" or "telnyx", which is also the name of the provider that
	// signed it, as rows name their provider (SMS_PROVIDERS).
	Source string
	// Unnamed names the provider a row that names none belongs to (a row
	// sent with a single SMS_PROVIDER, or attempted before migration
	// 0019): the receipt applies to such a row only when Source is that
	// provider. NoProvider: to none. Empty: to any, as before migration
	// 0025; the receiver always names one.
	Unnamed string
}

// NoProvider as Receipt.Unnamed says that no provider's receipt settles
// a row that names none.
const NoProvider = "none"

// Why sendonce_apply_receipts refused a receipt (ReceiptResult.Refused).
const (
	// RefusedProvider: the row belongs to another provider than the one
	// that signed the receipt (or names none, and Receipt.Unnamed is
	// another).
	RefusedProvider = "provider"
	// RefusedUnsent: the row was never claimed for sending since it was
	// written or replayed, and no attempt of it is logged: no provider can
	// have its message.
	RefusedUnsent = "unsent"
	// RefusedReference: the receipt names another message than the one
	// the row records as its provider's (provider_ref).
	RefusedReference = "reference"
)

// ReceiptResult says what one receipt did.
type ReceiptResult struct {
	// Found is false when no row has the receipt's reference: nothing was
	// recorded (a provider that retries a non-2xx answer must not be made
	// to retry this one forever).
	Found bool
	// Prev is the row's status before the receipt.
	Prev State
	// Applied is true when the receipt moved the row.
	Applied bool
	// Refused says why the receipt was refused (RefusedProvider,
	// RefusedUnsent, RefusedReference): it changed nothing, was not
	// recorded, and is answered like a receipt for no row. Empty when it
	// was taken.
	Refused string
}

// Contradicted reports whether the receipt says the provider had a message
// the row says never reached it (a dead row). The provider's signed word
// wins over sendonce's own conclusion: the row moved to what the receipt
// says (Applied), so that nobody replays a message the user may have, and
// a person should look at how it came to be dead.
func (r ReceiptResult) Contradicted() bool { return r.Found && r.Prev == StatusDead && r.Applied }

// SettledUnknown reports whether the receipt settled an unknown row.
func (r ReceiptResult) SettledUnknown() bool { return r.Applied && r.Prev == StatusUnknown }

// applyReceiptsSQL writes one round of receipts (no row twice): $1 ids in
// id order, $2 statuses, $3 provider refs, $4 codes, $5 reported times, $6
// sources, $7 the providers rows that name none belong to. The function
// (migrations 0018 and 0025) locks the rows, refuses each receipt its row's
// provider did not sign or cannot have sent, records each other receipt
// not recorded before, moves each row its receipt may move, and answers
// per receipt (in input order) the row's status before, whether it moved
// and why it was refused. It runs with the table owner's rights: the
// receiver's role has no UPDATE on sms_outbox, so that no receiver login
// can move a row any other way (a delivered row back to pending, a dead
// row to delivered without a receipt).
var applyReceiptsSQL = stmt("apply_receipts")

// ApplyReceipts records receipts as evidence of their rows and moves each row
// as far as its receipt shows, never backwards: a delivery report over any
// status but a final one (delivered, undelivered), and evidence of
// acceptance over an unfinished or unknown row. So a receipt may come before
// the sender's own sent write (that write then changes nothing), twice, or
// out of order, and nothing is lost or undone. A receipt for a dead row
// contradicts it (ReceiptResult.Contradicted) and moves it too, to sent,
// delivered or undelivered: dead said the provider never took the message,
// and the provider's signed word says otherwise.
//
// A receipt counts only for a row of the provider that signed it
// (Receipt.Source, or Receipt.Unnamed for a row that names none), that was
// claimed for sending (the provider can have its message), and, when both
// name the provider's id for the message, about the same message; any
// other is refused (ReceiptResult.Refused) and changes nothing. It returns
// one result per receipt, in order. Rows are locked in id order, as every
// other writer locks them.
func ApplyReceipts(ctx context.Context, tx pgx.Tx, rs []Receipt) ([]ReceiptResult, error) {
	out := make([]ReceiptResult, len(rs))
	// One statement moves a row once: a second receipt for a row in the
	// same batch goes to a round of its own, in arrival order.
	idx := make([]int, len(rs))
	for i := range idx {
		idx[i] = i
	}
	for len(idx) > 0 {
		seen := map[uuid.UUID]bool{}
		var round, later []int
		for _, i := range idx {
			if seen[rs[i].ID] {
				later = append(later, i)
				continue
			}
			seen[rs[i].ID] = true
			round = append(round, i)
		}
		if err := applyReceiptRound(ctx, tx, rs, round, out); err != nil {
			return nil, err
		}
		idx = later
	}
	return out, nil
}

func applyReceiptRound(ctx context.Context, tx pgx.Tx, rs []Receipt, round []int, out []ReceiptResult) error {
	slices.SortFunc(round, func(a, b int) int { return compareUUID(rs[a].ID, rs[b].ID) })
	n := len(round)
	var (
		ids      = make([]uuid.UUID, n)
		statuses = make([]string, n)
		refs     = make([]*string, n)
		codes    = make([]*int32, n)
		ats      = make([]*time.Time, n)
		sources  = make([]string, n)
		unnamed  = make([]*string, n)
	)
	for k, i := range round {
		r := rs[i]
		switch r.Status {
		case StatusSent, StatusDelivered, StatusUndelivered:
		default:
			return fmt.Errorf("outbox: receipt status %q is not sent, delivered or undelivered", r.Status)
		}
		ids[k], statuses[k], sources[k] = r.ID, string(r.Status), r.Source
		if r.Unnamed != "" {
			u := r.Unnamed
			unnamed[k] = &u
		}
		if ref := clean(r.ProviderRef); ref != "" {
			refs[k] = &ref
		}
		if r.Code != 0 {
			c := int32(r.Code)
			codes[k] = &c
		}
		if !r.At.IsZero() {
			at := r.At
			ats[k] = &at
		}
	}
	rows, _ := tx.Query(ctx, applyReceiptsSQL, uuidArray(ids), statuses, refs, codes, ats, sources, unnamed)
	var (
		k       int64
		prev    *string
		applied bool
		refused *string
	)
	_, err := pgx.ForEachRow(rows, []any{&k, &prev, &applied, &refused}, func() error {
		r := ReceiptResult{Applied: applied}
		if prev != nil {
			r.Found, r.Prev = true, State(*prev)
		}
		if refused != nil {
			r.Refused = *refused
		}
		out[round[k-1]] = r
		return nil
	})
	if err != nil {
		return fmt.Errorf("outbox: apply receipts: %w", err)
	}
	return nil
}

// Evidence is one receipt or lookup answer recorded for a row.
type Evidence struct {
	// Kind is "receipt" or "lookup".
	Kind string
	// Result is delivered, undelivered or accepted (receipts); found, none,
	// several or failed (lookups).
	Result      string
	ProviderRef string
	Code        int
	Detail      string
	// ReportedAt is the provider's time, zero when it gave none.
	ReportedAt time.Time
	// ReceivedAt is when sendonce recorded it.
	ReceivedAt time.Time
	// Source is generic or twilio (receipts), sender or resolve (lookups).
	Source string
}

// RecordLookup records a lookup's answer for row id.
func RecordLookup(ctx context.Context, q Querier, id uuid.UUID, e Evidence) error {
	var ref *string
	if r := clean(e.ProviderRef); r != "" {
		ref = &r
	}
	_, err := q.Exec(ctx, recordLookupSQL, id, e.Result, ref, clean(e.Detail), e.Source)
	if err != nil {
		return fmt.Errorf("outbox: record lookup: %w", err)
	}
	return nil
}

// EvidenceOf returns the receipts and lookups recorded for row id, oldest
// first, their text made fit for an operator's screen (safetext).
func EvidenceOf(ctx context.Context, q Querier, id uuid.UUID) ([]Evidence, error) {
	rows, _ := q.Query(ctx, evidenceOfSQL, id)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Evidence, error) {
		var e Evidence
		err := r.Scan(&e.Kind, &e.Result, &e.ProviderRef, &e.Code, &e.Detail, &e.ReportedAt, &e.ReceivedAt, &e.Source)
		if e.ReportedAt.Equal(time.Unix(0, 0)) {
			e.ReportedAt = time.Time{}
		}
		// A provider's id is shown as it is (an operator searches by it),
		// with controls only removed.
		e.Result, e.ProviderRef, e.Source = safetext.Field(e.Result), safetext.Clean(e.ProviderRef), safetext.Field(e.Source)
		e.Detail = safetext.Field(e.Detail)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read evidence: %w", err)
	}
	return out, nil
}

// Traceparent returns the W3C Trace Context row id was enqueued in, ""
// when it was enqueued in none, ErrNotFound when there is no such row:
// the receiver links a receipt's span to its message's trace with it.
func Traceparent(ctx context.Context, q Querier, id uuid.UUID) (string, error) {
	var tp *string
	err := q.QueryRow(ctx, traceparentSQL, id).Scan(&tp)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("outbox: read a row's traceparent: %w", err)
	}
	if tp == nil {
		return "", nil
	}
	return *tp, nil
}

// insertLookups records the lookups of a batch of results as evidence. again
// says the batch may have been committed before: a record already there
// (same row, same time) is not added twice.
func insertLookups(ctx context.Context, tx pgx.Tx, results []Result, again bool) error {
	var (
		ids     []uuid.UUID
		outcome []string
		refs    []*string
		details []string
		at      []time.Time
		sources []string
	)
	for _, r := range results {
		e := r.Lookup
		if e == nil {
			continue
		}
		ids = append(ids, r.ID)
		outcome = append(outcome, e.Result)
		var ref *string
		if v := clean(e.ProviderRef); v != "" {
			ref = &v
		}
		refs = append(refs, ref)
		details = append(details, clean(e.Detail))
		at = append(at, e.ReceivedAt)
		sources = append(sources, e.Source)
	}
	if len(ids) == 0 {
		return nil
	}
	sql := insertLookupsSQL
	if again {
		// One index lookup per answer, as for receipts (applyReceiptsSQL).
		sql = insertLookupsAgainSQL
	}
	if _, err := tx.Exec(ctx, sql, uuidArray(ids), outcome, refs, details, at, sources); err != nil {
		return fmt.Errorf("outbox: record lookups: %w", err)
	}
	return nil
}

// The statements of this file (sql.go).
var (
	evidenceOfSQL         = stmt("evidence_of")
	recordLookupSQL       = stmt("record_lookup")
	insertLookupsSQL      = stmt("insert_lookups")
	insertLookupsAgainSQL = stmt("insert_lookups_again")
	traceparentSQL        = stmt("traceparent")
)
