package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// PurgeFloor is the shortest age sendonce_purge accepts (migration 0018):
// whoever calls it, a row finished less than an hour ago stays, with its
// attempts, evidence and trace.
const PurgeFloor = time.Hour

// Purge deletes up to limit finished rows whose last change is older than
// age, with their attempts and evidence, and returns how many it deleted.
// Only rows that are done with are purged: sent, delivered and undelivered
// rows, and dead rows whose dead letter is recorded (letter_seq; the
// reconciler publishes a missing one from the row). An unknown row waits
// for a person to settle it, however old. Rows another purger holds are
// skipped, so each call locks at most limit rows for a few milliseconds.
//
// The delete runs in the function sendonce_purge (migration 0010), with the
// table owner's rights: the relay's role holds no DELETE on the tables, so
// it can remove nothing the function's rule does not allow. limit must be 1
// to 10000 and age at least PurgeFloor, which the function enforces.
func Purge(ctx context.Context, q Querier, age time.Duration, limit int) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, purgeSQL, age, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	return n, nil
}

// The age queries below each read the first entries of a partial index
// (their conditions imply its predicate), so their cost does not grow with
// the table or the backlog. Each is its own statement so that one slow or
// failing query does not cost the others their value.
var (
	// oldestPendingSQL reads the first entries of each priority (the check
	// on the column allows 1 to 3) in the pending index, which is ordered
	// by priority first: a plain min(created_at) over the pending rows
	// reads every one of them (40 ms on 50,000 pending rows, every
	// measurement, as the backlog it measures grows). A row written with a
	// send time waits from then, not from its insert: of the first 100 of
	// each lane, the one that has waited longest.
	oldestPendingSQL  = stmt("oldest_pending")
	oldestInFlightSQL = stmt("oldest_in_flight")
	oldestFinishedSQL = stmt("oldest_finished")
	oldestUrgentSQL   = stmt("oldest_urgent")
)

// OldestPendingAge returns the age of the oldest pending row (0 when none):
// how far the relay lags.
func OldestPendingAge(ctx context.Context, q Querier) (time.Duration, error) {
	return age(ctx, q, "oldest pending row", oldestPendingSQL)
}

// OldestInFlightAge returns the time since the least recently touched
// queued or sending row changed (0 when none).
func OldestInFlightAge(ctx context.Context, q Querier) (time.Duration, error) {
	return age(ctx, q, "oldest in-flight row", oldestInFlightSQL)
}

// OldestPurgeableAge returns the time since the least recently changed row
// that retention may purge (sent, delivered, undelivered, dead) changed (0
// when none): above the
// retention age, retention is falling behind or failing.
func OldestPurgeableAge(ctx context.Context, q Querier) (time.Duration, error) {
	return age(ctx, q, "oldest finished row", oldestFinishedSQL)
}

// OldestTransactionAge returns the age of the oldest open transaction of
// another session in this database (0 when none). A long transaction holds
// back vacuum on every table, so dead rows pile up behind it. The figure
// comes from sendonce_oldest_transaction (migration 0027), which reads
// pg_stat_activity with the table owner's rights: the relay's role sees no
// other session's SQL.
func OldestTransactionAge(ctx context.Context, q Querier) (time.Duration, error) {
	return age(ctx, q, "oldest transaction", oldestTransactionSQL)
}

func age(ctx context.Context, q Querier, what, sql string) (time.Duration, error) {
	var secs *float64
	if err := q.QueryRow(ctx, sql).Scan(&secs); err != nil {
		return 0, fmt.Errorf("outbox: %s: %w", what, err)
	}
	if secs == nil {
		return 0, nil
	}
	return time.Duration(max(0, *secs) * float64(time.Second)), nil
}

// countSQL holds, per unfinished status, a count capped by $1 whose
// condition implies a partial index's predicate.
var countSQL = map[State]string{
	StatusPending: stmt("count_pending"),
	StatusQueued:  stmt("count_queued"),
	StatusSending: stmt("count_sending"),
	// sms_outbox_scheduled_idx (migration 0030).
	StatusScheduled: stmt("count_scheduled"),
}

// CountUpTo counts the rows with status (scheduled, pending, queued or
// sending), but reads at most limit of them: its cost is bounded however large a backlog
// grows. A result of limit means "limit or more".
func CountUpTo(ctx context.Context, q Querier, status State, limit int) (int64, error) {
	sql, ok := countSQL[status]
	if !ok {
		return 0, fmt.Errorf("outbox: count rows: status %q is not scheduled, pending, queued or sending", status)
	}
	var n int64
	if err := q.QueryRow(ctx, sql, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count %s rows: %w", status, err)
	}
	return n, nil
}

// EstimateRows returns the planner's estimate of the rows with status, from
// the table's statistics scaled to its current size: free, and close enough
// for a backlog too large to count.
func EstimateRows(ctx context.Context, q Querier, status State) (int64, error) {
	if _, ok := countSQL[status]; !ok {
		return 0, fmt.Errorf("outbox: estimate rows: status %q is not scheduled, pending, queued or sending", status)
	}
	return estimateStatus(ctx, q, status)
}

// estimateSQL holds estimate_status.sql filled with each status, made
// once at initialization rather than at each call. The status is a
// literal in the statement, as it always was, not a parameter: the
// estimate is the planner's for that value.
var estimateSQL = estimateStatements(ConsoleStatuses)

func estimateStatements(statuses []State) map[State]string {
	out := make(map[State]string, len(statuses))
	for _, s := range statuses {
		out[s] = fill(stmt("estimate_status"), "status", string(s))
	}
	return out
}

// estimateStatus is the planner's estimate of the rows with status, one
// of ConsoleStatuses.
func estimateStatus(ctx context.Context, q Querier, status State) (int64, error) {
	sql, ok := estimateSQL[status]
	if !ok {
		return 0, fmt.Errorf("outbox: estimate rows: %q is not a status", status)
	}
	var plan string
	if err := q.QueryRow(ctx, sql).Scan(&plan); err != nil {
		return 0, fmt.Errorf("outbox: estimate %s rows: %w", status, err)
	}
	var out []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(plan), &out); err != nil || len(out) != 1 {
		return 0, fmt.Errorf("outbox: estimate %s rows: unexpected plan %q: %v", status, plan, err)
	}
	return int64(out[0].Plan.Rows), nil
}

// TableStats is what the statistics collector knows of one table.
type TableStats struct {
	// Table is sms_outbox or sms_attempts.
	Table string
	// Live and Dead are the estimated live and dead row versions.
	Live, Dead int64
	// LastVacuum is the end of the last vacuum, manual or automatic (zero:
	// never).
	LastVacuum time.Time
}

// Tables returns the statistics of sms_outbox and sms_attempts, read from
// pg_stat_user_tables (no scan of the tables).
func Tables(ctx context.Context, q Querier) ([]TableStats, error) {
	rows, err := q.Query(ctx, tableStatisticsSQL)
	if err != nil {
		return nil, fmt.Errorf("outbox: table statistics: %w", err)
	}
	defer rows.Close()
	var out []TableStats
	for rows.Next() {
		var s TableStats
		var vac *time.Time
		if err := rows.Scan(&s.Table, &s.Live, &s.Dead, &vac); err != nil {
			return nil, fmt.Errorf("outbox: table statistics: %w", err)
		}
		if vac != nil {
			s.LastVacuum = *vac
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: table statistics: %w", err)
	}
	return out, nil
}

// OldestUrgent returns the age of the oldest urgent row not yet sent
// (pending, queued or sending), zero when there is none. It reads only the
// partial index of urgent rows in flight, so a bulk backlog costs it
// nothing.
func OldestUrgent(ctx context.Context, q Querier) (time.Duration, error) {
	var age *float64
	err := q.QueryRow(ctx, oldestUrgentSQL).Scan(&age)
	if err != nil {
		return 0, fmt.Errorf("outbox: oldest urgent row: %w", err)
	}
	if age == nil {
		return 0, nil
	}
	return time.Duration(max(0, *age) * float64(time.Second)), nil
}

// The statements of this file (sql.go).
var (
	oldestTransactionSQL = stmt("oldest_transaction")
	purgeSQL             = stmt("purge")
	tableStatisticsSQL   = stmt("table_statistics")
)
