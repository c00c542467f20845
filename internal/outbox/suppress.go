package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/safetext"
)

// The suppression list (sms_suppressions, migration 0032): numbers no
// provider is called for. Every write goes through a function of the
// database's that runs with the table owner's rights, each granted to the
// component that makes it; a row to a number on the list ends suppressed
// at its claim (ClaimForSendTo).

// The sources of a suppression-list entry.
const (
	// SourceInbound: the recipient replied an opt-out keyword, which a
	// provider forwarded to the receiver.
	SourceInbound = "inbound"
	// SourceRefusal: a provider refused a send because the recipient had
	// opted out (Twilio's 21610 and its like).
	SourceRefusal = "refusal"
	// SourceReceipt: a provider's delivery receipt reported such a
	// refusal (a code that means opted out).
	SourceReceipt = "receipt"
	// SourceOperator: an operator added it (relay suppress add, the
	// console).
	SourceOperator = "operator"
	// SourceImport: relay suppress import added it from a file.
	SourceImport = "import"
	// SourceApp: the application added it (sendonce_suppress).
	SourceApp = "app"
)

// Sources are the sources of suppression-list entries, in the order
// metrics and pages list them.
var Sources = []string{SourceInbound, SourceRefusal, SourceReceipt, SourceOperator, SourceImport, SourceApp}

var e164 = regexp.MustCompile(`^\+[1-9][0-9]{1,14}$`)

// ValidNumber reports whether s is a number the list takes: E.164, "+" and
// 2 to 15 digits, the first not 0 (as sms_outbox's numbers are).
func ValidNumber(s string) bool { return e164.MatchString(s) }

// AnalyzeSuppressions brings the list's statistics up to date
// (sendonce_suppression_analyze), after an import: the senders' claims
// then probe a large list by its key rather than read it.
func AnalyzeSuppressions(ctx context.Context, q Querier) error {
	if _, err := q.Exec(ctx, analyzeSuppressionsSQL); err != nil {
		return fmt.Errorf("outbox: analyze the suppression list: %w", err)
	}
	return nil
}

// Suppression asks a status write to put the row's number on the
// suppression list, in the same transaction and before the row's own
// status is written (Result.Suppress).
type Suppression struct {
	// Source is SourceRefusal or SourceReceipt.
	Source string
	// Provider names the provider that reported it.
	Provider string
	// Reason says what it reported (its code), without personal data.
	Reason string
}

// suppressRows puts the numbers of the results that ask for it on the
// list (sendonce_suppress_rows): the sender's role cannot write the list
// itself, nor read another row's number through it.
func suppressRows(ctx context.Context, tx pgx.Tx, results []Result) error {
	var ids []uuid.UUID
	var provs, reasons []string
	for _, r := range results {
		if r.Suppress == nil {
			continue
		}
		if r.Suppress.Source != SourceRefusal {
			return fmt.Errorf("outbox: suppress numbers: a status write's source is %s, not %s", r.Suppress.Source, SourceRefusal)
		}
		ids, provs, reasons = append(ids, r.ID), append(provs, r.Suppress.Provider), append(reasons, clean(r.Suppress.Reason))
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, suppressRowsSQL,
		uuidArray(ids), SourceRefusal, provs, reasons); err != nil {
		return fmt.Errorf("outbox: suppress the numbers providers refused as opted out: %w", err)
	}
	return nil
}

// SuppressReceipted puts the numbers of rows ids on the list: their
// providers' receipts reported codes that mean the recipient opted out
// (provs[i] the provider, reasons[i] the code). The receiver calls it in
// the transaction that records the receipts.
func SuppressReceipted(ctx context.Context, tx pgx.Tx, ids []uuid.UUID, provs, reasons []string) error {
	if len(ids) == 0 {
		return nil
	}
	if len(provs) != len(ids) || len(reasons) != len(ids) {
		return fmt.Errorf("outbox: suppress receipted numbers: %d ids, %d providers, %d reasons", len(ids), len(provs), len(reasons))
	}
	if _, err := tx.Exec(ctx, suppressRowsSQL,
		uuidArray(ids), SourceReceipt, provs, reasons); err != nil {
		return fmt.Errorf("outbox: suppress the numbers receipts reported opted out: %w", err)
	}
	return nil
}

// The results of ApplyInbound.
const (
	// InboundSuppressed: the number was added.
	InboundSuppressed = "suppressed"
	// InboundLifted: the number's entry was removed.
	InboundLifted = "lifted"
	// InboundUnchanged: a STOP for a number on the list, or a START for
	// one not on it.
	InboundUnchanged = "unchanged"
	// InboundKept: a START for a number an operator or an import put on
	// the list: only an operator removes it.
	InboundKept = "kept"
)

// Inbound is an opt-out or opt-in keyword a recipient sent, as a provider
// forwarded it.
type Inbound struct {
	// Number is the recipient's number (E.164).
	Number string
	// Provider names the provider that forwarded it.
	Provider string
	// Keyword is the keyword (STOP, START, ...), recorded as the reason.
	Keyword string
	// Lift is true for an opt-in keyword (START), false for an opt-out.
	Lift bool
}

// ApplyInbound records one keyword (sendonce_suppress_inbound) and returns
// what it did: InboundSuppressed, InboundLifted, InboundUnchanged or
// InboundKept. Committed when it returns (one statement).
func ApplyInbound(ctx context.Context, q Querier, in Inbound) (string, error) {
	var res string
	if err := q.QueryRow(ctx, applyInboundSQL, in.Number, in.Provider, in.Keyword, in.Lift).Scan(&res); err != nil {
		return "", fmt.Errorf("outbox: record an inbound keyword: %w", err)
	}
	return res, nil
}

// SuppressNumbers adds numbers (E.164) to the list as an operator's
// (source SourceOperator) or an import's (SourceImport) entries, by who,
// for reason, and returns how many were not on it. One statement: all or
// none.
func SuppressNumbers(ctx context.Context, q Querier, numbers []string, source, reason, by string) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, suppressNumbersSQL, numbers, source, reason, by).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: add numbers to the suppression list: %w", err)
	}
	return n, nil
}

// Unsuppress removes number from the list, recording who removed it and
// why (both required), and reports whether it was on the list.
func Unsuppress(ctx context.Context, q Querier, number, by, reason string) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, unsuppressSQL, number, by, reason).Scan(&ok); err != nil {
		return false, fmt.Errorf("outbox: remove a number from the suppression list: %w", err)
	}
	return ok, nil
}

// SuppressionEntry is an entry of the list as operators see it: the
// number masked.
type SuppressionEntry struct {
	// Seq orders the list (its pages).
	Seq int64
	// NumberMasked is the number as MaskPhone shows it.
	NumberMasked string
	// Source is one of Sources; Provider the provider that reported it
	// (inbound, refusal, receipt), empty otherwise.
	Source, Provider string
	// Reason is why (a keyword, a code, an operator's words; the
	// database masks any run of seven digits or more); By who added it.
	Reason, By string
	// At is when it was added.
	At time.Time
}

// Describe is the entry in one line, for relay trace and the console:
// "inbound twilio STOP, since 2026-...Z".
func (e SuppressionEntry) Describe() string {
	s := e.Source
	if e.Provider != "" {
		s += " " + e.Provider
	}
	if e.Reason != "" {
		s += " " + e.Reason
	}
	if e.By != "" && e.By != e.Provider && (e.Source == SourceOperator || e.Source == SourceImport || e.Source == SourceApp) {
		s += " (by " + e.By + ")"
	}
	return s + ", since " + e.At.UTC().Format("2006-01-02T15:04:05.000Z")
}

func (e *SuppressionEntry) clean() {
	e.NumberMasked, e.Source, e.Provider = safetext.Clean(e.NumberMasked), safetext.Clean(e.Source), safetext.Clean(e.Provider)
	e.Reason, e.By = safetext.Clean(e.Reason), safetext.Clean(e.By)
}

// SuppressionRemoval is a past removal of a number from the list.
type SuppressionRemoval struct {
	// Added is the entry as it was.
	Added SuppressionEntry
	// At, By, Via and Reason say when, who (an operator, or the provider
	// that forwarded a START), through what (operator: relay suppress;
	// console; inbound) and why.
	At              time.Time
	By, Via, Reason string
}

// CheckSuppression returns number's entry (nil when it is not on the list)
// and its past removals, newest first.
func CheckSuppression(ctx context.Context, q Querier, number string) (*SuppressionEntry, []SuppressionRemoval, error) {
	rows, _ := q.Query(ctx, checkSuppressionSQL, number)
	entries, err := pgx.CollectRows(rows, scanEntry)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: check a number: %w", err)
	}
	rows, _ = q.Query(ctx, suppressionRemovalsSQL, number)
	removals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SuppressionRemoval, error) {
		var x SuppressionRemoval
		err := r.Scan(&x.Added.Source, &x.Added.Provider, &x.Added.Reason, &x.Added.By, &x.Added.At, &x.At, &x.By, &x.Via, &x.Reason)
		x.Added.clean()
		x.By, x.Via, x.Reason = safetext.Clean(x.By), safetext.Clean(x.Via), safetext.Clean(x.Reason)
		return x, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: read a number's removals: %w", err)
	}
	if len(entries) == 0 {
		return nil, removals, nil
	}
	e := entries[0]
	e.NumberMasked = MaskPhone(number)
	return &e, removals, nil
}

func scanEntry(r pgx.CollectableRow) (SuppressionEntry, error) {
	var e SuppressionEntry
	err := r.Scan(&e.Seq, &e.NumberMasked, &e.Source, &e.Provider, &e.Reason, &e.By, &e.At)
	e.clean()
	return e, err
}

// Suppressions returns up to limit entries of the list after seq after
// (0: from the first), in the order they were added, numbers masked, and
// the after of the next page (0 when there is none).
func Suppressions(ctx context.Context, q Querier, after int64, limit int) ([]SuppressionEntry, int64, error) {
	rows, _ := q.Query(ctx, suppressionsPageSQL, after, limit+1)
	entries, err := pgx.CollectRows(rows, scanEntry)
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: list the suppression list: %w", err)
	}
	var next int64
	if len(entries) > limit {
		entries = entries[:limit]
		next = entries[limit-1].Seq
	}
	return entries, next, nil
}

// SuppressionOf returns the entry of row id's number, nil when the number
// is not on the list (or there is no such row).
func SuppressionOf(ctx context.Context, q Querier, id uuid.UUID) (*SuppressionEntry, error) {
	var e SuppressionEntry
	err := q.QueryRow(ctx, suppressionOfSQL, id).
		Scan(&e.Seq, &e.Source, &e.Provider, &e.Reason, &e.By, &e.At)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: read the suppression of a row's number: %w", err)
	}
	e.clean()
	return &e, nil
}

// CountSuppressions counts the list's entries by source, reading at most
// limit of them; capped is set when it stopped there (the counts are then
// a floor).
func CountSuppressions(ctx context.Context, q Querier, limit int) (map[string]int64, bool, error) {
	rows, _ := q.Query(ctx, countSuppressionsSQL, limit)
	out := make(map[string]int64, len(Sources))
	for _, s := range Sources {
		out[s] = 0
	}
	var (
		src   string
		n     int64
		total int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&src, &n}, func() error {
		out[src] += n
		total += n
		return nil
	}); err != nil {
		return nil, false, fmt.Errorf("outbox: count the suppression list: %w", err)
	}
	return out, total >= int64(limit), nil
}

// ConsoleSuppression is a console user's addition or removal of a number,
// and its audit row.
type ConsoleSuppression struct {
	// User, Role and Remote say who asked, as the console knows them.
	User, Role, Remote string
	// Remove is true for a removal, false for an addition.
	Remove bool
	// Number and Reason are what was asked (a removal needs a reason).
	Number, Reason string
	// Set by ConsoleSuppress: the audit row's id and time, and whether
	// the list changed.
	AuditID int64
	At      time.Time
	Changed bool
}

// ConsoleSuppress makes the console's change and its audit row in one
// statement (sendonce_console_suppress).
func ConsoleSuppress(ctx context.Context, q Querier, c *ConsoleSuppression) error {
	action := "suppress"
	if c.Remove {
		action = "unsuppress"
	}
	err := q.QueryRow(ctx, consoleSuppressSQL,
		c.User, c.Role, action, c.Number, c.Reason, c.Remote).Scan(&c.AuditID, &c.At, &c.Changed)
	if err != nil {
		return fmt.Errorf("outbox: %s a number from the console: %w", action, err)
	}
	return nil
}

// ConsoleSuppressions returns the newest limit additions and removals
// made from the console, newest first (their audit rows).
func ConsoleSuppressions(ctx context.Context, q Querier, limit int) ([]ConsoleAction, error) {
	rows, _ := q.Query(ctx, consoleSuppressionsSQL, limit)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsoleAction, error) {
		var a ConsoleAction
		err := r.Scan(&a.ID, &a.At, &a.User, &a.Role, &a.Action, &a.Detail, &a.Changed, &a.Remote)
		a.User, a.Role, a.Action, a.Remote = safetext.Clean(a.User), safetext.Clean(a.Role), safetext.Clean(a.Action), safetext.Clean(a.Remote)
		a.Detail = safetext.Clean(a.Detail)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read the console's suppressions: %w", err)
	}
	return out, nil
}

// ConsoleAction is an audit row of a console change other than a replay.
type ConsoleAction struct {
	ID                         int64
	At                         time.Time
	User, Role, Action, Remote string
	// Detail is the masked number and the reason.
	Detail string
	// Changed is false when the change found nothing to do.
	Changed bool
}

// The statements of this file (sql.go).
var (
	analyzeSuppressionsSQL = stmt("analyze_suppressions")
	applyInboundSQL        = stmt("apply_inbound")
	checkSuppressionSQL    = stmt("check_suppression")
	consoleSuppressSQL     = stmt("console_suppress")
	consoleSuppressionsSQL = stmt("console_suppressions")
	countSuppressionsSQL   = stmt("count_suppressions")
	suppressNumbersSQL     = stmt("suppress_numbers")
	suppressRowsSQL        = stmt("suppress_rows")
	suppressionOfSQL       = stmt("suppression_of")
	suppressionRemovalsSQL = stmt("suppression_removals")
	suppressionsPageSQL    = stmt("suppressions_page")
	unsuppressSQL          = stmt("unsuppress")
)
