package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/safetext"
)

// The statements of the operator console (relay console). They run as the
// role sendonce_console, which reads every column but the number and the
// body, and they stay cheap on a table of millions of rows: each reads a
// partial index whose predicate it repeats word for word, or a bounded
// range of one, or the planner's statistics; none counts the whole table.

// ConsoleStatuses are the statuses the console shows, in pipeline order.
var ConsoleStatuses = []State{StatusScheduled, StatusPending, StatusQueued, StatusSending, StatusSent,
	StatusDelivered, StatusUndelivered, StatusDead, StatusUnknown, StatusExpired, StatusCancelled, StatusSuppressed}

// StatusCount is the number of rows in one status.
type StatusCount struct {
	Status State
	Rows   int64
	// Estimated is set when Rows comes from the planner's statistics
	// rather than a count.
	Estimated bool
}

// backlogBound bounds the count of one unfinished status on a large table.
const backlogBound = 1_000_000

// endedBound bounds the count of dead and unknown rows on a large table:
// 200,000 of them took 87 ms to count on a 10-million-row table, and a
// week at 100 million messages a day keeps millions, which would take
// seconds at every load of the overview.
const endedBound = 250_000

// CountStatuses returns the rows in each of ConsoleStatuses. On a table the
// statistics put under exactBelow rows it counts them all (one pass over a
// small table). Above, it counts the statuses a partial index serves
// (pending, queued, sending, dead, unknown; a backlog beyond a million rows,
// and dead and unknown rows beyond 250,000 together, are estimated) and estimates the others (sent and later: the bulk of the
// table) from the live-row estimate less those counts, split by the
// statistics' frequencies.
func CountStatuses(ctx context.Context, q Querier, exactBelow int64) ([]StatusCount, error) {
	var live int64
	var freqs map[string]float64
	var vals []string
	var fs []float32
	err := q.QueryRow(ctx, statusStatisticsSQL).
		Scan(&live, &vals, &fs)
	if err != nil {
		return nil, fmt.Errorf("outbox: table statistics: %w", err)
	}
	counts := map[State]int64{}
	estimated := map[State]bool{}
	if live < exactBelow {
		rows, _ := q.Query(ctx, countByStatusSQL)
		var s string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&s, &n}, func() error { counts[State(s)] = n; return nil }); err != nil {
			return nil, fmt.Errorf("outbox: count rows: %w", err)
		}
	} else {
		// The unfinished statuses are counted from their partial indexes up
		// to a bound (a backlog beyond it is estimated, as the relay's
		// gauges do).
		for _, st := range []State{StatusScheduled, StatusPending, StatusQueued, StatusSending} {
			n, err := CountUpTo(ctx, q, st, backlogBound)
			if err != nil {
				return nil, err
			}
			if n >= backlogBound {
				if n, err = EstimateRows(ctx, q, st); err != nil {
					return nil, err
				}
				estimated[st] = true
			}
			counts[st] = n
		}
		dead, unknown, est, err := countEnded(ctx, q, endedBound)
		if err != nil {
			return nil, err
		}
		counts[StatusDead], counts[StatusUnknown] = dead, unknown
		estimated[StatusDead], estimated[StatusUnknown] = est, est
		pending, queued, sending := counts[StatusPending], counts[StatusQueued], counts[StatusSending]
		freqs = map[string]float64{}
		for i, v := range vals {
			if i < len(fs) {
				freqs[v] = float64(fs[i])
			}
		}
		rest := live - pending - queued - sending - dead - unknown - counts[StatusScheduled]
		var bulk []State
		var total float64
		for _, s := range ConsoleStatuses {
			if _, counted := counts[s]; !counted {
				bulk = append(bulk, s)
				total += freqs[string(s)]
			}
		}
		for _, s := range bulk {
			share := freqs[string(s)] / total
			if total == 0 && s == StatusSent {
				share = 1
			} else if total == 0 {
				share = 0
			}
			counts[s] = max(0, int64(float64(rest)*share+0.5))
			estimated[s] = true
		}
	}
	out := make([]StatusCount, 0, len(ConsoleStatuses))
	for _, s := range ConsoleStatuses {
		out = append(out, StatusCount{Status: s, Rows: counts[s], Estimated: estimated[s]})
	}
	return out, nil
}

// countEnded counts the dead and the unknown rows from their partial index
// (migration 0011, which carries the status), reading at most bound
// entries of it; when there are more, both are estimated from the
// statistics (est).
func countEnded(ctx context.Context, q Querier, bound int) (dead, unknown int64, est bool, err error) {
	var seen int64
	err = q.QueryRow(ctx, countEndedSQL, bound).Scan(&dead, &unknown, &seen)
	if err != nil {
		return 0, 0, false, fmt.Errorf("outbox: count dead and unknown rows: %w", err)
	}
	if seen < int64(bound) {
		return dead, unknown, false, nil
	}
	if dead, err = estimateStatus(ctx, q, StatusDead); err != nil {
		return 0, 0, false, err
	}
	if unknown, err = estimateStatus(ctx, q, StatusUnknown); err != nil {
		return 0, 0, false, err
	}
	return dead, unknown, true, nil
}

// WindowCount is the number of rows in a status whose last change (their
// creation, for pending rows) lies in a time window.
type WindowCount struct {
	Status State
	Rows   int64
	// Capped is set when the count stopped at its bound: Rows is a lower
	// bound.
	Capped bool
	// Untracked is set for a status no index counts by time (scheduled
	// rows are indexed by their send time): Rows is 0 and means nothing.
	Untracked bool
}

// CountChanged returns, for each of ConsoleStatuses, the rows now in it
// whose last change came at or after since. Each count reads a range of a
// partial index (index-only where it can: the final rows' index and the
// dead rows' carry the status) and stops at limit rows.
func CountChanged(ctx context.Context, q Querier, since time.Time, limit int) ([]WindowCount, error) {
	var pending, queued, sending, sent, delivered, undelivered, final, dead, unknown, expired, cancelled, suppressed, unsent int64
	err := q.QueryRow(ctx, countChangedSQL,
		since, limit).Scan(&pending, &queued, &sending, &sent, &delivered, &undelivered, &final, &dead, &unknown,
		&expired, &cancelled, &suppressed, &unsent)
	if err != nil {
		return nil, fmt.Errorf("outbox: count recent rows: %w", err)
	}
	lim := int64(limit)
	got := map[State]WindowCount{
		StatusPending:     {Rows: pending, Capped: pending >= lim},
		StatusQueued:      {Rows: queued, Capped: queued+sending >= lim},
		StatusSending:     {Rows: sending, Capped: queued+sending >= lim},
		StatusSent:        {Rows: sent, Capped: final >= lim},
		StatusDelivered:   {Rows: delivered, Capped: final >= lim},
		StatusUndelivered: {Rows: undelivered, Capped: final >= lim},
		StatusDead:        {Rows: dead, Capped: dead+unknown >= lim},
		StatusUnknown:     {Rows: unknown, Capped: dead+unknown >= lim},
		StatusScheduled:   {Untracked: true},
		StatusExpired:     {Rows: expired, Capped: unsent >= lim},
		StatusCancelled:   {Rows: cancelled, Capped: unsent >= lim},
		StatusSuppressed:  {Rows: suppressed, Capped: unsent >= lim},
	}
	out := make([]WindowCount, 0, len(ConsoleStatuses))
	for _, s := range ConsoleStatuses {
		w := got[s]
		w.Status = s
		out = append(out, w)
	}
	return out, nil
}

// MinuteAttempts counts the attempts that started in one minute, by
// outcome class.
type MinuteAttempts struct {
	// Minute is the start of the minute.
	Minute time.Time
	// Sent counts the messages whose acceptance was written in the minute
	// (sent_at: a first attempt that was sent has no record in the log);
	// Retry and Failed the attempts of the log whose outcome was retry or
	// rate_limited (the row is tried again), or one that ended the row
	// (permanent, ambiguous, max_attempts) or looked it up.
	Sent, Retry, Failed int64
}

// AttemptsPerMinute returns the attempts from since on, per minute (minutes
// without attempts left out): the log's from its index on started_at, the
// accepted messages from the final rows' index on updated_at (a row's
// sent_at is never later than its updated_at). Each minute starts at since
// plus whole minutes; Postgres keeps microseconds, so give a since without
// a finer part.
func AttemptsPerMinute(ctx context.Context, q Querier, since time.Time) ([]MinuteAttempts, error) {
	rows, _ := q.Query(ctx, attemptsPerMinuteSQL, since)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MinuteAttempts, error) {
		var m MinuteAttempts
		err := r.Scan(&m.Minute, &m.Sent, &m.Retry, &m.Failed)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: attempts per minute: %w", err)
	}
	return out, nil
}

// DeadByReason counts the rows that became dead or unknown at or after
// since, by dead-letter reason.
func DeadByReason(ctx context.Context, q Querier, since time.Time) (map[string]int64, error) {
	rows, _ := q.Query(ctx, deadByReasonSQL, since)
	out := map[string]int64{}
	var reason string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&reason, &n}, func() error { out[reason] = n; return nil }); err != nil {
		return nil, fmt.Errorf("outbox: dead rows by reason: %w", err)
	}
	return out, nil
}

// DeadFilter selects dead and unknown rows for the console.
type DeadFilter struct {
	// Reason, when set, keeps rows with this dead-letter reason.
	Reason string
	// Since and Until, when set, bound the time the row ended.
	Since, Until time.Time
	// ProviderCode, when set, keeps rows whose last attempt got this
	// provider error code.
	ProviderCode *int
}

// statement fills template (dead_rows.sql or dead_summary.sql) for f and
// limit, and returns it with its arguments. The conditions are the only
// SQL of the package left in Go: which of them a filter sets decides
// their parameters' numbers, so they cannot be one static statement, and
// a file per combination would be sixteen copies of each. Each is fixed
// text with a parameter, never input; TestEveryStatementPrepares prepares
// both templates filled here, with no condition set and with all.
func (f DeadFilter) statement(template string, limit int) (string, []any) {
	conds := []string{`o.status IN ('dead', 'unknown')`}
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if f.Reason != "" {
		add(`o.end_reason = $%d`, f.Reason)
	}
	if !f.Since.IsZero() {
		add(`o.updated_at >= $%d`, f.Since)
	}
	if !f.Until.IsZero() {
		add(`o.updated_at < $%d`, f.Until)
	}
	if f.ProviderCode != nil {
		add(`coalesce(a.provider_code, 0) = $%d`, *f.ProviderCode)
	}
	args = append(args, limit)
	return fill(template, "where", strings.Join(conds, " AND "), "limit", fmt.Sprintf("$%d", len(args))), args
}

// DeadRow is a dead or unknown row as the console lists it.
type DeadRow struct {
	ID       uuid.UUID
	Status   State
	Reason   string
	Gen      int32
	Attempts int
	// LetterSeq is the SMS_DLQ sequence of the row's dead letter: nil while
	// it is not stored, 0 for a row finished before letters were tracked.
	LetterSeq    *int64
	LastError    string
	ProviderCode int
	HTTPStatus   int
	EndedAt      time.Time
}

// DeadRows returns the newest limit rows matching f, newest first.
func DeadRows(ctx context.Context, q Querier, f DeadFilter, limit int) ([]DeadRow, error) {
	sql, args := f.statement(deadRowsSQL, limit)
	rows, _ := q.Query(ctx, sql, args...)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadRow, error) {
		var d DeadRow
		err := r.Scan(&d.ID, &d.Status, &d.Reason, &d.Gen, &d.Attempts, &d.LetterSeq, &d.LastError, &d.ProviderCode, &d.HTTPStatus, &d.EndedAt)
		d.Reason, d.LastError = safetext.Field(d.Reason), safetext.Field(d.LastError)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: dead rows: %w", err)
	}
	return out, nil
}

// DeadSummary counts the rows matching a DeadFilter.
type DeadSummary struct {
	// Rows is the number of matching rows, at most the bound.
	Rows int64
	// Capped is set when the count stopped at its bound.
	Capped bool
	// ByCode and ByReason count them by their last attempt's provider code
	// (0: none) and by reason.
	ByCode   map[int]int64
	ByReason map[string]int64
}

// SummarizeDead counts the newest limit rows matching f by provider code
// and by reason.
func SummarizeDead(ctx context.Context, q Querier, f DeadFilter, limit int) (DeadSummary, error) {
	sql, args := f.statement(deadSummarySQL, limit)
	rows, _ := q.Query(ctx, sql, args...)
	s := DeadSummary{ByCode: map[int]int64{}, ByReason: map[string]int64{}}
	var code int
	var reason string
	var n int64
	_, err := pgx.ForEachRow(rows, []any{&code, &reason, &n}, func() error {
		s.ByCode[code] += n
		s.ByReason[reason] += n
		s.Rows += n
		return nil
	})
	if err != nil {
		return DeadSummary{}, fmt.Errorf("outbox: summarize dead rows: %w", err)
	}
	s.Capped = s.Rows >= int64(limit)
	return s, nil
}

// LetterSeqs returns the SMS_DLQ sequences of the current dead letters of
// those of ids that are dead or unknown and whose letter is stored and
// tracked (a row finished before letters were tracked has none here).
func LetterSeqs(ctx context.Context, q Querier, ids []uuid.UUID) (map[uuid.UUID]uint64, error) {
	rows, _ := q.Query(ctx, letterSeqsSQL, uuidArray(ids))
	out := map[uuid.UUID]uint64{}
	var id uuid.UUID
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &seq}, func() error { out[id] = uint64(seq); return nil }); err != nil {
		return nil, fmt.Errorf("outbox: letter sequences: %w", err)
	}
	return out, nil
}

// MaskedMessage is a row as the console shows it.
type MaskedMessage struct {
	Row
	// Priority is 1 (urgent), 2 (normal) or 3 (bulk).
	Priority int16
}

// MaskedRow reads one row for the console: what GetRow reads, with the
// number masked and the body's length taken from the view
// sms_outbox_masked, so that the console's role needs no right on either.
func MaskedRow(ctx context.Context, q Querier, id uuid.UUID) (MaskedMessage, error) {
	var m MaskedMessage
	r := &m.Row
	var ref, lastErr, reason *string
	var leaseUntil *time.Time
	err := q.QueryRow(ctx, maskedRowSQL, id).
		Scan(&r.ID, &r.Status, &r.ToMasked, &r.BodyChars, &r.Attempts, &r.MaxAttempts, &r.Gen,
			&r.StreamSeq, &ref, &lastErr, &r.CreatedAt, &r.UpdatedAt, &r.NextAttemptAt, &r.MaybeAccepted,
			&leaseUntil, &reason, &r.LetterSeq, &m.Priority, &r.LookupPending, &r.Lookups)
	if errors.Is(err, pgx.ErrNoRows) {
		return MaskedMessage{}, ErrNotFound
	}
	if err != nil {
		return MaskedMessage{}, fmt.Errorf("outbox: read row: %w", err)
	}
	r.setText(ref, lastErr, reason)
	if leaseUntil != nil {
		r.LeaseUntil = *leaseUntil
	}
	return m, nil
}

// FindByProviderRef returns the rows whose provider_ref is ref (at most a
// few: a provider's message id names one message). No index serves it: it
// reads the table, so it is for a search an operator asks for, not a page
// that refreshes.
func FindByProviderRef(ctx context.Context, q Querier, ref string) ([]uuid.UUID, error) {
	rows, _ := q.Query(ctx, findByProviderRefSQL, ref)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("outbox: find by provider ref: %w", err)
	}
	return ids, nil
}

// ConsoleReplay is one replay an operator made from the console, as its
// audit table records it. Only the database writes the record, with the
// replay (Replay, ReplayOptions.Audit).
type ConsoleReplay struct {
	ID         int64
	At         time.Time
	User, Role string
	// Requested are the rows asked for; Replayed those put back to pending.
	Requested, Replayed []uuid.UUID
	Refused             int
	// Remote is the client's address.
	Remote string
}

// ConsoleReplays returns the newest limit console replays, newest first;
// with row set, only those that replayed it.
func ConsoleReplays(ctx context.Context, q Querier, row uuid.UUID, limit int) ([]ConsoleReplay, error) {
	sql, args := consoleReplaysSQL, []any{limit}
	if row != uuid.Nil {
		sql, args = consoleReplaysOfRowSQL, append(args, row)
	}
	rows, _ := q.Query(ctx, sql, args...)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsoleReplay, error) {
		var c ConsoleReplay
		err := r.Scan(&c.ID, &c.At, &c.User, &c.Role, &c.Requested, &c.Replayed, &c.Refused, &c.Remote)
		c.User, c.Role, c.Remote = safetext.Clean(c.User), safetext.Clean(c.Role), safetext.Clean(c.Remote)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: console replays: %w", err)
	}
	return out, nil
}

// OldestRow is the oldest row of a kind, if any.
type OldestRow struct {
	Found  bool
	ID     uuid.UUID
	Status State
	// Since is when the row was created (pending) or last changed (in
	// flight).
	Since time.Time
	// Due is when a queued row's retry was due, or a sending row's lease
	// ends: past it (and the reconciler's grace) the row counts as stuck.
	Due time.Time
}

// OldestRows returns the oldest pending row (its age is the relay's lag)
// and the in-flight (queued or sending) row changed longest ago, from the
// partial indexes on unfinished rows.
func OldestRows(ctx context.Context, q Querier) (pending, inflight OldestRow, err error) {
	rows, _ := q.Query(ctx, oldestRowsSQL)
	var r OldestRow
	_, err = pgx.ForEachRow(rows, []any{&r.ID, &r.Status, &r.Since, &r.Due}, func() error {
		r.Found = true
		if r.Status == StatusPending {
			pending = r
		} else {
			inflight = r
		}
		return nil
	})
	if err != nil {
		return OldestRow{}, OldestRow{}, fmt.Errorf("outbox: oldest rows: %w", err)
	}
	return pending, inflight, nil
}

// ProviderShare is one provider's part of the traffic since a time.
type ProviderShare struct {
	Provider string
	// Sent counts the rows it accepted; Failed the calls to it that did
	// not end sent (retries, refusals, lost answers); Moved the messages
	// that moved from it to the next provider, which had certainly not
	// taken them.
	Sent, Failed, Moved int64
}

// ProviderShares counts each named provider's traffic since since (rows
// that name no provider, from a sender with one unnamed provider, are not
// counted), in provider order.
func ProviderShares(ctx context.Context, q Querier, since time.Time) ([]ProviderShare, error) {
	rows, _ := q.Query(ctx, providerSharesSQL, since)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProviderShare, error) {
		var p ProviderShare
		err := r.Scan(&p.Provider, &p.Sent, &p.Failed, &p.Moved)
		p.Provider = safetext.Clean(p.Provider)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: providers' shares: %w", err)
	}
	return out, nil
}

// The statements of this file (sql.go).
var (
	attemptsPerMinuteSQL   = stmt("attempts_per_minute")
	countByStatusSQL       = stmt("count_by_status")
	countChangedSQL        = stmt("count_changed")
	countEndedSQL          = stmt("count_ended")
	deadByReasonSQL        = stmt("dead_by_reason")
	findByProviderRefSQL   = stmt("find_by_provider_ref")
	letterSeqsSQL          = stmt("letter_seqs")
	maskedRowSQL           = stmt("masked_row")
	oldestRowsSQL          = stmt("oldest_rows")
	providerSharesSQL      = stmt("provider_shares")
	statusStatisticsSQL    = stmt("status_statistics")
	consoleReplaysSQL      = stmt("console_replays")
	consoleReplaysOfRowSQL = stmt("console_replays_of_row")
	deadRowsSQL            = stmt("dead_rows")
	deadSummarySQL         = stmt("dead_summary")
)
