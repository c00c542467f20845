package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce/internal/safetext"
)

// ReplayTarget names a row to replay.
type ReplayTarget struct {
	// ID is the row.
	ID uuid.UUID
	// FromLetter restricts the replay to a row whose current state is the
	// one its dead letter describes: dead or unknown, publish generation
	// Gen, dead-letter reason Reason. A letter older than the row's state
	// (the row was replayed since and ended again, perhaps for another
	// reason) replays nothing.
	FromLetter bool
	Gen        int32
	Reason     string
	// SafeUnknown says that replaying the row if it is unknown cannot send
	// it twice: its attempts went to a provider that honours idempotency
	// keys (as its dead letter recorded).
	SafeUnknown bool
	// Elsewhere names another provider that may have the message (as the
	// letter recorded), for the refusal; such a target is never
	// SafeUnknown.
	Elsewhere string
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// DryRun reports what would be done and changes nothing.
	DryRun bool
	// Force replays unknown rows that are not SafeUnknown, and rows with
	// evidence that the provider may have their message (ReplayResult.
	// Evidence): the message may then be sent twice.
	Force bool
	// Audit, when set, replays as the operator console, whose role may not
	// update the table: the rows are read and locked through
	// sendonce_replay_rows and, unless DryRun, moved by
	// sendonce_console_replay (migration 0018), which records the replay in
	// the console's audit table in the same statement: User, Role,
	// Requested (every row asked for, refused ones included) and Remote
	// are recorded, and ID, At, Replayed and Refused are set from the
	// record. Force is refused: the console never forces.
	Audit *ConsoleReplay
}

// ReplayResult says what Replay did with one row.
type ReplayResult struct {
	// ID is the row id.
	ID uuid.UUID
	// Status is the row's status before the replay ("" when there is no row).
	Status State
	// Replayed is true when the row went back to pending (or would, in a
	// dry run).
	Replayed bool
	// Gen is the new publish generation (when replayed).
	Gen int32
	// Refused says why the row was not replayed (when not replayed).
	Refused string
	// NeedsForce marks a row refused only for want of Force: unknown at a
	// provider that may not honour idempotency keys, or with Evidence.
	NeedsForce bool
	// Evidence names what was recorded that says the provider may have the
	// row's message (a receipt, or a lookup that found it once or more),
	// empty when nothing does; such a row is replayed only with Force.
	Evidence string
}

// Replay puts dead or unknown rows back to pending with the same id (the
// same idempotency key), a new publish generation (so JetStream does not
// deduplicate the republication) and a fresh attempt budget; the attempts
// log keeps the history. Sent rows are refused, and so are rows still in
// flight, rows whose letter is stale (see ReplayTarget.FromLetter) and,
// unless opts.Force, rows with evidence that the provider may have their
// message (a receipt, or a lookup that found it, at any time: a provider's
// key may have expired since, and the replay would send it again) and
// unknown rows that are not SafeUnknown. It returns one result per
// distinct row, in the order of targets.
func Replay(ctx context.Context, tx pgx.Tx, targets []ReplayTarget, opts ReplayOptions) ([]ReplayResult, error) {
	if opts.Audit != nil && opts.Force {
		return nil, errors.New("outbox: replay: the console does not force a replay")
	}
	ids := make([]uuid.UUID, 0, len(targets))
	for _, t := range targets {
		ids = append(ids, t.ID)
	}
	read := replayLockRowsSQL
	if opts.Audit != nil {
		// The console's function locks only the dead rows, and skips one
		// another transaction holds (held) rather than wait for it.
		read = replayLockRowsConsoleSQL
	}
	rows, _ := tx.Query(ctx, read, uuidArray(ids))
	type cur struct {
		status State
		gen    int32
		reason string
		held   bool
	}
	byID := map[uuid.UUID]cur{}
	var (
		id     uuid.UUID
		c      cur
		status string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &status, &c.gen, &c.reason, &c.held}, func() error {
		c.status = State(status)
		byID[id] = c
		return nil
	}); err != nil {
		return nil, fmt.Errorf("outbox: replay: %w", err)
	}
	evidence, err := providerMayHave(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	// A row named by several letters is replayed by the one that describes
	// its current state, if any.
	pick := map[uuid.UUID]ReplayTarget{}
	var order []uuid.UUID
	for _, t := range targets {
		prev, seen := pick[t.ID]
		if !seen {
			order = append(order, t.ID)
		}
		c, ok := byID[t.ID]
		if !seen || (ok && !matches(prev, c.gen, c.reason) && matches(t, c.gen, c.reason)) {
			pick[t.ID] = t
		}
	}
	out := make([]ReplayResult, 0, len(order))
	for _, id := range order {
		t := pick[id]
		c, ok := byID[id]
		r := ReplayResult{ID: id, Status: c.status, Evidence: evidence[id]}
		switch {
		case !ok:
			r.Refused = "no such row"
		case c.held:
			r.Refused = "another transaction holds the row (a receipt or a status write): try again"
		case c.status != StatusDead && c.status != StatusUnknown:
			r.Refused = refusal(c.status)
		case !matches(t, c.gen, c.reason):
			r.Refused = fmt.Sprintf("stale letter (generation %d, %s): the row is now %s in generation %d (%s)",
				t.Gen, t.Reason, c.status, c.gen, c.reason)
		case c.status == StatusUnknown && opts.Audit != nil:
			// The database lets the console replay dead rows only
			// (sendonce_console_replay): an unknown row's safety rests on
			// the provider's idempotency, which the row does not record.
			r.Refused = "unknown: the provider may have the message; the console replays dead rows only (relay dlq replay, after relay trace)"
		case r.Evidence != "" && !opts.Force:
			r.Refused = "the provider may have the message: " + r.Evidence + "; a replay may send it again (relay dlq replay -force, after relay trace)"
			r.NeedsForce = true
		case c.status == StatusUnknown && t.Elsewhere != "" && !opts.Force:
			r.Refused = "unknown, and " + t.Elsewhere + " provider of SMS_PROVIDERS, which could not be asked, may have the message: a replay may send it twice (relay resolve, or -force after relay trace)"
			r.NeedsForce = true
		case c.status == StatusUnknown && !t.SafeUnknown && !opts.Force:
			r.Refused = "unknown at a provider that may not honour idempotency keys: a replay may send it twice (-force)"
			r.NeedsForce = true
		default:
			r.Replayed, r.Gen = true, c.gen+1
		}
		if r.Replayed && !opts.DryRun && opts.Audit == nil {
			// The move to pending gives the row its attempts back: the
			// database does it (migration 0026), the relay's role may not
			// write attempt_count.
			_, err := tx.Exec(ctx, replayRowSQL, id)
			if err != nil {
				return nil, fmt.Errorf("outbox: replay %s: %w", id, err)
			}
		}
		out = append(out, r)
	}
	if !opts.DryRun && opts.Audit != nil {
		if err := consoleReplay(ctx, tx, out, opts.Audit); err != nil {
			return nil, err
		}
	}
	if !opts.DryRun {
		// Wake the relays now rather than at their next poll.
		if _, err := tx.Exec(ctx, notifyRelaysSQL); err != nil {
			return nil, fmt.Errorf("outbox: replay: notify: %w", err)
		}
	}
	return out, nil
}

// consoleReplay moves the rows out decides to replay through the console's
// function, which records the replay as audit says, and sets audit from the
// record. A row the function did not move (it changed since it was read,
// which its lock prevents, or evidence came) is refused after all.
func consoleReplay(ctx context.Context, tx pgx.Tx, out []ReplayResult, audit *ConsoleReplay) error {
	var ids []uuid.UUID
	for _, r := range out {
		if r.Replayed {
			ids = append(ids, r.ID)
		}
	}
	var replayed []uuid.UUID
	err := tx.QueryRow(ctx, consoleReplaySQL,
		audit.User, audit.Role, uuidArray(audit.Requested), uuidArray(ids), audit.Remote).Scan(&audit.ID, &audit.At, &replayed)
	if err != nil {
		return fmt.Errorf("outbox: console replay: %w", err)
	}
	moved := make(map[uuid.UUID]bool, len(replayed))
	for _, id := range replayed {
		moved[id] = true
	}
	audit.Replayed = replayed
	audit.Refused = len(audit.Requested) - len(audit.Replayed)
	for i, r := range out {
		if r.Replayed && !moved[r.ID] {
			out[i].Replayed, out[i].Gen = false, 0
			out[i].Refused = "changed while it was replayed, or the provider may have the message: relay trace shows it"
		}
	}
	return nil
}

// providerMayHave returns, for the rows among ids with evidence that the
// provider may have their message (any receipt; a lookup that found it
// once or more), what the newest such record says, and how many there are.
func providerMayHave(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	rows, _ := tx.Query(ctx, providerMayHaveSQL, uuidArray(ids))
	out := map[uuid.UUID]string{}
	var (
		id                   uuid.UUID
		kind, result, source string
		at                   time.Time
		n                    int
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &kind, &result, &source, &at, &n}, func() error {
		if _, seen := out[id]; seen {
			return nil
		}
		when := at.UTC().Format(time.RFC3339)
		what := fmt.Sprintf("a %s receipt from %s at %s", safetext.Field(result), safetext.Field(source), when)
		if kind == "lookup" {
			what = fmt.Sprintf("a lookup by %s at %s found it", safetext.Field(source), when)
			if result == "several" {
				what += " more than once"
			}
		}
		if n > 1 {
			what += fmt.Sprintf(", with %d more such records", n-1)
		}
		out[id] = what
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: replay: read evidence: %w", err)
	}
	return out, nil
}

func matches(t ReplayTarget, gen int32, reason string) bool {
	return !t.FromLetter || (t.Gen == gen && t.Reason == reason)
}

func refusal(s State) string {
	switch s {
	case StatusSent, StatusDelivered, StatusUndelivered:
		return "already sent"
	case StatusSuppressed:
		return "suppressed: its number was on the suppression list, and a suppressed message is never replayed (relay suppress check; a new message is sent once the number is off the list)"
	case StatusExpired, StatusCancelled:
		return fmt.Sprintf("%s before any call: never replayed", s)
	}
	return fmt.Sprintf("still in flight (%s)", s)
}

// Row is everything the operator's trace shows of an outbox row; the phone
// number is masked and the body reduced to its length.
type Row struct {
	ID                     uuid.UUID
	Status                 State
	ToMasked               string
	BodyChars              int
	Attempts, MaxAttempts  int
	Gen                    int32
	StreamSeq              *int64
	ProviderRef, LastError string
	CreatedAt, UpdatedAt   time.Time
	NextAttemptAt          time.Time
	// MaybeAccepted is set once an attempt may have reached the provider.
	MaybeAccepted bool
	// LeaseUntil is when the latest claim's lease ends (zero if never
	// claimed since leases were stamped).
	LeaseUntil time.Time
	// EndReason is the dead-letter reason of a dead or unknown row.
	EndReason string
	// LetterSeq is the SMS_DLQ sequence of the row's dead letter, nil while
	// it is not stored.
	LetterSeq *int64
	// LookupPending: the row waits for a lookup of its last attempt;
	// Lookups counts the lookups that failed.
	LookupPending bool
	Lookups       int
	// Provider is the provider the row belongs to; empty for a row no
	// claim has named one for.
	Provider string
	// SendAt and ExpiresAt are the application's send time and expiry
	// (migration 0030); nil when it set none.
	SendAt, ExpiresAt *time.Time
}

// GetRow reads one row for a trace; its free text is made fit for an
// operator's screen (safetext).
func GetRow(ctx context.Context, q Querier, id uuid.UUID) (Row, error) {
	var r Row
	var to string
	var ref, lastErr, reason *string
	var leaseUntil *time.Time
	dest := []any{&r.Attempts, &r.MaxAttempts, &r.Gen, &r.StreamSeq, &ref, &lastErr, &r.CreatedAt, &r.UpdatedAt,
		&r.NextAttemptAt, &r.MaybeAccepted, &leaseUntil, &reason, &r.LetterSeq, &r.LookupPending, &r.Lookups, &r.Provider,
		&r.SendAt, &r.ExpiresAt}
	err := q.QueryRow(ctx, getRowSQL, id).
		Scan(append([]any{&r.ID, &r.Status, &to, &r.BodyChars}, dest...)...)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		// A role without access to the number and the body (the relay's)
		// still sees everything else.
		err = q.QueryRow(ctx, getRowWithoutContentSQL, id).
			Scan(append([]any{&r.ID, &r.Status}, dest...)...)
		to, r.BodyChars = "", -1
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, ErrNotFound
	}
	if err != nil {
		return Row{}, fmt.Errorf("outbox: read row: %w", err)
	}
	r.ToMasked = "(not visible to this role)"
	if to != "" {
		r.ToMasked = MaskPhone(to)
	}
	r.setText(ref, lastErr, reason)
	r.Provider = safetext.Clean(r.Provider)
	if leaseUntil != nil {
		r.LeaseUntil = *leaseUntil
	}
	return r, nil
}

// setText sets the row's free-text columns for an operator's screen: any
// writer of the row (or an older release) may have put terminal controls,
// bidi overrides or a number in them (safetext).
func (r *Row) setText(ref, lastErr, reason *string) {
	if ref != nil {
		r.ProviderRef = safetext.Clean(*ref)
	}
	if lastErr != nil {
		r.LastError = safetext.Field(*lastErr)
	}
	if reason != nil {
		r.EndReason = safetext.Field(*reason)
	}
}

// Attempts returns the attempts of one row, oldest first, its text made fit
// for an operator's screen (safetext): the attempts log, and the first
// attempt when it was sent, which only the row describes (FromRow).
func Attempts(ctx context.Context, q Querier, id uuid.UUID) ([]Attempt, error) {
	rows, _ := q.Query(ctx, attemptsOfSQL, id)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		var ms float64
		var ord int64
		err := r.Scan(&a.OutboxID, &a.Number, &a.StartedAt, &ms, &a.Outcome, &a.HTTPStatus, &a.ProviderCode, &a.Error, &a.Sender, &a.Provider, &a.FromRow, &ord)
		a.Latency = time.Duration(ms * float64(time.Millisecond))
		a.Error, a.Sender, a.Provider = safetext.Field(a.Error), safetext.Clean(a.Sender), safetext.Clean(a.Provider)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read attempts: %w", err)
	}
	return out, nil
}

// MaskPhone is safetext.MaskPhone: "+15551234567" becomes "+1*******67".
func MaskPhone(e164 string) string { return safetext.MaskPhone(e164) }

// MiscountedAttempts counts the rows among ids (every row when ids is nil)
// whose attempt_count does not match the attempts log: a test oracle, for
// the rule that only an attempt spends one of a row's max_attempts (a 429
// and a lookup give it back).
//
// The count and the log meet by attempt number. A claim takes the next
// number (attempt_count + 1); a 429, and a lookup that settles the row or
// fails, are logged under it and give it back, so that the next claim
// takes the same number again; a lookup that finds nothing is logged
// beside the call that follows it, under the same number; the first
// attempt of a row never republished, when it was sent, is described by
// its row and not logged (the rule Attempts follows); a sender that dies
// mid-call logs nothing (the stale claim after it takes the next number),
// and the reconciler that finishes such a row logs its decision under the
// dead attempt's number. A replay starts the count again at 0 while the log
// keeps the older records, so only the records since the row's latest
// replay count: those after the last place, in order of start, where the
// numbers go down. A row is miscounted when, among those records:
//   - a number the count includes has records, but only of 429s and
//     lookups: an attempt was charged for a call that was not made (the
//     first attempt sent, which its row describes, aside);
//   - a record of a call (or of a decision that ended the row) has a
//     number beyond the count: a spent attempt was given back.
//
// A number without any record is a sender that died mid-call: a charge
// that leaves no record at all looks the same and is not seen; nor is one
// hidden by a record of the same number from before a replay that the
// numbers do not show (a replay right after attempt 1).
func MiscountedAttempts(ctx context.Context, q Querier, ids []uuid.UUID) (int, error) {
	var n int
	err := q.QueryRow(ctx, miscountedAttemptsSQL, idsOrNull(ids)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: count miscounted attempts: %w", err)
	}
	return n, nil
}

// idsOrNull is ids for a uuid[] parameter, or SQL NULL when ids is nil.
func idsOrNull(ids []uuid.UUID) any {
	if ids == nil {
		return nil
	}
	return uuidArray(ids)
}

// The statements of this file (sql.go).
var (
	attemptsOfSQL            = stmt("attempts_of")
	consoleReplaySQL         = stmt("console_replay")
	miscountedAttemptsSQL    = stmt("miscounted_attempts")
	notifyRelaysSQL          = stmt("notify_relays")
	providerMayHaveSQL       = stmt("provider_may_have")
	replayLockRowsSQL        = stmt("replay_lock_rows")
	replayLockRowsConsoleSQL = stmt("replay_lock_rows_console")
	replayRowSQL             = stmt("replay_row")
	getRowSQL                = stmt("get_row")
	getRowWithoutContentSQL  = stmt("get_row_without_content")
)
