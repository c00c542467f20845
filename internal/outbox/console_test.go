package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// consoleRow inserts a row in status, last changed age ago, as the table
// owner; dead and unknown rows get a reason and a letter.
func consoleRow(t *testing.T, pool *pgxpool.Pool, status outbox.State, age time.Duration) uuid.UUID {
	t.Helper()
	id := uuid.New()
	var reason *string
	var letter *int64
	if status == outbox.StatusDead || status == outbox.StatusUnknown {
		r, seq := "permanent", int64(7)
		if status == outbox.StatusUnknown {
			r = "ambiguous"
		}
		reason, letter = &r, &seq
	}
	_, err := pool.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status, end_reason, letter_seq, created_at, updated_at)
		VALUES ($1, '+15551234567', 'Your code is 482901', $2, $3, $4, now() - $5::interval, now() - $5::interval)`,
		id, string(status), reason, letter, age)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func attempt(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, outcome string, code int, age time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO sms_attempts (outbox_id, attempt, started_at, latency_ms, outcome, http_status, provider_code)
		VALUES ($1, 1, now() - $2::interval, 12.5, $3, 400, nullif($4, 0))`, id, age, outcome, code)
	if err != nil {
		t.Fatal(err)
	}
}

func countsOf(cs []outbox.StatusCount) (map[outbox.State]int64, map[outbox.State]bool) {
	n, est := map[outbox.State]int64{}, map[outbox.State]bool{}
	for _, c := range cs {
		n[c.Status], est[c.Status] = c.Rows, c.Estimated
	}
	return n, est
}

// Below the size bound every status is counted; above it the statuses with
// a partial index are counted and the bulk is estimated from statistics,
// which on a freshly analyzed small table agree with the counts.
func TestCountStatusesExactAndEstimated(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	want := map[outbox.State]int64{outbox.StatusPending: 3, outbox.StatusQueued: 2, outbox.StatusSending: 1,
		outbox.StatusSent: 5, outbox.StatusDead: 2, outbox.StatusUnknown: 1}
	for s, n := range want {
		for range n {
			consoleRow(t, pool, s, time.Minute)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name       string
		exactBelow int64
		estimated  []outbox.State
	}{
		{"exact", 1_000_000, nil},
		{"estimated", 0, []outbox.State{outbox.StatusSent, outbox.StatusDelivered, outbox.StatusUndelivered}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs, err := outbox.CountStatuses(ctx, pool, tt.exactBelow)
			if err != nil {
				t.Fatal(err)
			}
			if len(cs) != len(outbox.ConsoleStatuses) {
				t.Fatalf("%d statuses, want %d", len(cs), len(outbox.ConsoleStatuses))
			}
			got, est := countsOf(cs)
			for _, s := range outbox.ConsoleStatuses {
				if got[s] != want[s] {
					t.Errorf("%s: %d rows, want %d", s, got[s], want[s])
				}
			}
			for _, s := range tt.estimated {
				if !est[s] {
					t.Errorf("%s not marked estimated", s)
				}
			}
			if est[outbox.StatusDead] || est[outbox.StatusPending] {
				t.Error("an indexed status is marked estimated")
			}
		})
	}
}

func TestCountChangedCountsTheWindowAndStopsAtTheBound(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	for range 3 {
		consoleRow(t, pool, outbox.StatusSent, time.Minute)
		consoleRow(t, pool, outbox.StatusSent, 48*time.Hour)
	}
	consoleRow(t, pool, outbox.StatusPending, time.Minute)
	consoleRow(t, pool, outbox.StatusDead, 2*time.Hour)
	consoleRow(t, pool, outbox.StatusQueued, 30*time.Minute)
	for range 2 {
		consoleRow(t, pool, outbox.StatusDelivered, 10*time.Minute)
	}
	consoleRow(t, pool, outbox.StatusDelivered, 3*time.Hour)
	consoleRow(t, pool, outbox.StatusUndelivered, 20*time.Minute)
	consoleRow(t, pool, outbox.StatusUndelivered, 30*time.Hour)
	byStatus := func(ws []outbox.WindowCount) map[outbox.State]outbox.WindowCount {
		m := map[outbox.State]outbox.WindowCount{}
		for _, w := range ws {
			m[w.Status] = w
		}
		return m
	}
	hour, err := outbox.CountChanged(ctx, pool, time.Now().Add(-time.Hour), 100)
	if err != nil {
		t.Fatal(err)
	}
	h := byStatus(hour)
	if h[outbox.StatusSent].Rows != 3 || h[outbox.StatusPending].Rows != 1 || h[outbox.StatusQueued].Rows != 1 || h[outbox.StatusDead].Rows != 0 ||
		h[outbox.StatusDelivered].Rows != 2 || h[outbox.StatusUndelivered].Rows != 1 || h[outbox.StatusDelivered].Capped {
		t.Errorf("last hour: %+v", hour)
	}
	day, err := outbox.CountChanged(ctx, pool, time.Now().Add(-24*time.Hour), 100)
	if err != nil {
		t.Fatal(err)
	}
	if d := byStatus(day); d[outbox.StatusSent].Rows != 3 || d[outbox.StatusDelivered].Rows != 3 || d[outbox.StatusUndelivered].Rows != 1 || d[outbox.StatusDead].Rows != 1 {
		t.Errorf("last day: %+v", day)
	}
	day, err = outbox.CountChanged(ctx, pool, time.Now().Add(-24*time.Hour), 2)
	if err != nil {
		t.Fatal(err)
	}
	d := byStatus(day)
	// 8 final rows in the window (3 sent, 3 delivered, 1 undelivered, 1
	// dead), counted up to 2.
	if !d[outbox.StatusSent].Capped || !d[outbox.StatusDelivered].Capped || !d[outbox.StatusUndelivered].Capped ||
		d[outbox.StatusSent].Rows+d[outbox.StatusDelivered].Rows+d[outbox.StatusUndelivered].Rows > 2 || d[outbox.StatusDead].Rows != 1 {
		t.Errorf("bounded day: %+v", day)
	}
	if d[outbox.StatusPending].Capped || d[outbox.StatusPending].Rows != 1 {
		t.Errorf("pending capped or miscounted: %+v", d[outbox.StatusPending])
	}
}

// The overview's counts of final rows read one partial index and nothing
// else (no heap, no other index): the planner, kept off sequential scans
// as it is on a large table, finds an index-only scan of the final rows'
// index for the statement CountChanged runs, and the same for retention's.
func TestFinalRowsAreCountedFromTheirIndexAlone(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	for _, s := range []outbox.State{outbox.StatusSent, outbox.StatusDelivered, outbox.StatusUndelivered, outbox.StatusDead} {
		consoleRow(t, pool, s, time.Minute)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`SELECT status FROM sms_outbox WHERE status IN ('sent', 'delivered', 'undelivered', 'dead') AND updated_at >= now() - interval '1 hour' LIMIT 500000`,
		`SELECT min(updated_at) FROM sms_outbox WHERE status IN ('sent', 'delivered', 'undelivered', 'dead')`,
	} {
		rows, err := tx.Query(ctx, `EXPLAIN (COSTS OFF) `+stmt)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, "Index Only Scan") || !strings.Contains(plan, "sms_outbox_final_idx") {
			t.Errorf("%s:\n%s\nwant an index-only scan of sms_outbox_final_idx", stmt, plan)
		}
	}
}

// The view the console reads numbers through masks them exactly as the
// logs do.
func TestMaskedViewMasksAsMaskPhone(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	for _, to := range []string{"+15551234567", "+447911123456", "+123", "+1234", "+861234567890123"} {
		id := uuid.New()
		if _, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, 'x')`, id, to); err != nil {
			t.Fatal(err)
		}
		row, err := outbox.MaskedRow(ctx, pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if row.ToMasked != outbox.MaskPhone(to) || row.BodyChars != 1 || row.Priority != 2 {
			t.Errorf("%s: view gives %q (%d chars), MaskPhone %q", to, row.ToMasked, row.BodyChars, outbox.MaskPhone(to))
		}
	}
	if _, err := outbox.MaskedRow(ctx, pool, uuid.New()); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("missing row: %v", err)
	}
}

func TestDeadRowsFilterAndSummary(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	a := consoleRow(t, pool, outbox.StatusDead, time.Minute)
	attempt(t, pool, a, "retry", 0, 2*time.Minute)
	attempt(t, pool, a, "permanent", 21211, time.Minute)
	b := consoleRow(t, pool, outbox.StatusDead, 3*time.Hour)
	attempt(t, pool, b, "permanent", 21610, 3*time.Hour)
	c := consoleRow(t, pool, outbox.StatusUnknown, 2*time.Minute)
	consoleRow(t, pool, outbox.StatusSent, time.Minute)
	code := 21211
	for _, tt := range []struct {
		name string
		f    outbox.DeadFilter
		want []uuid.UUID
	}{
		{"all", outbox.DeadFilter{}, []uuid.UUID{a, c, b}},
		{"reason", outbox.DeadFilter{Reason: "ambiguous"}, []uuid.UUID{c}},
		{"since", outbox.DeadFilter{Since: time.Now().Add(-time.Hour)}, []uuid.UUID{a, c}},
		{"until", outbox.DeadFilter{Until: time.Now().Add(-time.Hour)}, []uuid.UUID{b}},
		{"code", outbox.DeadFilter{ProviderCode: &code}, []uuid.UUID{a}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := outbox.DeadRows(ctx, pool, tt.f, 100)
			if err != nil {
				t.Fatal(err)
			}
			var got []uuid.UUID
			for _, r := range rows {
				got = append(got, r.ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("rows %v, want %v", got, tt.want)
			}
		})
	}
	rows, err := outbox.DeadRows(ctx, pool, outbox.DeadFilter{}, 1)
	if err != nil || len(rows) != 1 || rows[0].ID != a || rows[0].ProviderCode != 21211 || rows[0].HTTPStatus != 400 || rows[0].Reason != "permanent" {
		t.Fatalf("newest row: %+v, %v", rows, err)
	}
	s, err := outbox.SummarizeDead(ctx, pool, outbox.DeadFilter{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if s.Rows != 3 || s.Capped || s.ByCode[21211] != 1 || s.ByCode[21610] != 1 || s.ByCode[0] != 1 || s.ByReason["permanent"] != 2 || s.ByReason["ambiguous"] != 1 {
		t.Errorf("summary %+v", s)
	}
	if s, err := outbox.SummarizeDead(ctx, pool, outbox.DeadFilter{}, 2); err != nil || s.Rows != 2 || !s.Capped {
		t.Errorf("bounded summary %+v, %v", s, err)
	}
	dead, err := outbox.DeadByReason(ctx, pool, time.Now().Add(-time.Hour))
	if err != nil || dead["permanent"] != 1 || dead["ambiguous"] != 1 {
		t.Errorf("dead in the last hour: %v, %v", dead, err)
	}
}

func TestOldestRowsAndAttemptsPerMinute(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	if p, f, err := outbox.OldestRows(ctx, pool); err != nil || p.Found || f.Found {
		t.Fatalf("empty table: %+v %+v %v", p, f, err)
	}
	old := consoleRow(t, pool, outbox.StatusPending, 10*time.Minute)
	consoleRow(t, pool, outbox.StatusPending, time.Minute)
	stuck := consoleRow(t, pool, outbox.StatusSending, 20*time.Minute)
	consoleRow(t, pool, outbox.StatusQueued, 5*time.Minute)
	p, f, err := outbox.OldestRows(ctx, pool)
	if err != nil || p.ID != old || f.ID != stuck || f.Status != outbox.StatusSending {
		t.Fatalf("oldest: %+v %+v %v", p, f, err)
	}
	since := time.Now().Add(-time.Hour).Truncate(time.Second)
	// Sends are counted from the rows (sent_at), not from the log: a first
	// attempt that was sent has no record there.
	attempt(t, pool, stuck, "sent", 0, 30*time.Second)
	attempt(t, pool, stuck, "retry", 0, 40*time.Second)
	attempt(t, pool, stuck, "permanent", 1, 30*time.Minute)
	attempt(t, pool, stuck, "sent", 0, 2*time.Hour)
	sentAt := func(status outbox.State, sent, changed time.Duration) {
		t.Helper()
		id := consoleRow(t, pool, status, changed)
		if _, err := pool.Exec(ctx, `UPDATE sms_outbox SET sent_at = now() - $2::interval WHERE id = $1`, id, sent); err != nil {
			t.Fatal(err)
		}
	}
	sentAt(outbox.StatusSent, 20*time.Second, 20*time.Second)
	sentAt(outbox.StatusDelivered, 50*time.Minute, 10*time.Second) // its receipt came later
	sentAt(outbox.StatusDelivered, 2*time.Hour, time.Minute)       // sent before since
	sentAt(outbox.StatusSent, 3*time.Hour, 3*time.Hour)
	ms, err := outbox.AttemptsPerMinute(ctx, pool, since)
	if err != nil {
		t.Fatal(err)
	}
	var sent, retry, failed int64
	for _, m := range ms {
		if m.Minute.Before(since) || (m.Minute.Sub(since)%time.Minute) != 0 {
			t.Errorf("bucket %s is not since plus whole minutes", m.Minute)
		}
		sent, retry, failed = sent+m.Sent, retry+m.Retry, failed+m.Failed
	}
	if sent != 2 || retry != 1 || failed != 1 || len(ms) != 3 {
		t.Errorf("%d buckets: sent %d retry %d failed %d", len(ms), sent, retry, failed)
	}
}

// asConsole runs fn in a transaction acting as the role sendonce_console,
// rolled back afterwards.
func asConsole(t *testing.T, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL ROLE sendonce_console`); err != nil {
		t.Fatal(err)
	}
	return fn(tx)
}

// The console's role can run every statement the console runs, replay
// included, and nothing that reads a number or a body, deletes, or
// rewrites the audit.
func TestConsoleRoleGrants(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	dead := consoleRow(t, pool, outbox.StatusDead, time.Minute)
	attempt(t, pool, dead, "permanent", 21211, time.Minute)
	if err := outbox.RecordLookup(ctx, pool, dead, outbox.Evidence{Result: "found", ProviderRef: "msg_1",
		Detail: "lookup: the provider has the message (delivered)", Source: "resolve"}); err != nil {
		t.Fatal(err)
	}
	plain := consoleRow(t, pool, outbox.StatusDead, time.Minute)
	consoleRow(t, pool, outbox.StatusSent, time.Minute)
	if _, err := pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
	err := asConsole(t, pool, func(tx pgx.Tx) error {
		since := time.Now().Add(-time.Hour)
		steps := []struct {
			name string
			run  func() error
		}{
			{"count exact", func() error { _, err := outbox.CountStatuses(ctx, tx, 1_000_000); return err }},
			{"count estimated", func() error {
				cs, err := outbox.CountStatuses(ctx, tx, 0)
				if n, _ := countsOf(cs); err == nil && n[outbox.StatusSent] != 1 {
					return fmt.Errorf("sent estimated as %d, want 1 (statistics not visible to the role?)", n[outbox.StatusSent])
				}
				return err
			}},
			{"count changed", func() error { _, err := outbox.CountChanged(ctx, tx, since, 10); return err }},
			{"oldest", func() error { _, _, err := outbox.OldestRows(ctx, tx); return err }},
			{"oldest urgent", func() error { _, err := outbox.OldestUrgent(ctx, tx); return err }},
			{"attempts per minute", func() error { _, err := outbox.AttemptsPerMinute(ctx, tx, since); return err }},
			{"dead by reason", func() error { _, err := outbox.DeadByReason(ctx, tx, since); return err }},
			{"dead rows", func() error { _, err := outbox.DeadRows(ctx, tx, outbox.DeadFilter{}, 10); return err }},
			{"summary", func() error { _, err := outbox.SummarizeDead(ctx, tx, outbox.DeadFilter{}, 10); return err }},
			{"letter seqs", func() error { _, err := outbox.LetterSeqs(ctx, tx, []uuid.UUID{dead}); return err }},
			{"masked row", func() error { _, err := outbox.MaskedRow(ctx, tx, dead); return err }},
			{"attempts", func() error { _, err := outbox.Attempts(ctx, tx, dead); return err }},
			{"evidence", func() error {
				es, err := outbox.EvidenceOf(ctx, tx, dead)
				if err == nil && (len(es) != 1 || es[0].Result != "found" || es[0].Detail != "lookup: the provider has the message (delivered)") {
					return fmt.Errorf("evidence: %+v", es)
				}
				return err
			}},
			{"find by ref", func() error { _, err := outbox.FindByProviderRef(ctx, tx, "msg_1"); return err }},
			{"replay refused", func() error {
				// Refused over the lookup that found it: the role reads the
				// evidence, and the refusal is audited.
				audit := outbox.ConsoleReplay{User: "alice", Role: "operator", Requested: []uuid.UUID{dead}}
				rs, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: dead, FromLetter: true, Reason: "permanent"}}, outbox.ReplayOptions{Audit: &audit})
				if err == nil && (len(rs) != 1 || rs[0].Replayed || !rs[0].NeedsForce || !strings.Contains(rs[0].Evidence, "found it") ||
					audit.ID == 0 || audit.Refused != 1 || len(audit.Replayed) != 0) {
					return fmt.Errorf("replay: %+v, audit %+v", rs, audit)
				}
				return err
			}},
			{"replay", func() error {
				// Through the console's functions: the rows are locked and
				// moved, and the replay recorded, by the database.
				audit := outbox.ConsoleReplay{User: "alice", Role: "operator", Requested: []uuid.UUID{plain, dead}, Remote: "192.0.2.1"}
				rs, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: plain, FromLetter: true, Reason: "permanent"}}, outbox.ReplayOptions{Audit: &audit})
				if err == nil && (len(rs) != 1 || !rs[0].Replayed || rs[0].Gen != 1 || audit.ID == 0 || audit.At.IsZero() ||
					audit.Refused != 1 || len(audit.Replayed) != 1 || audit.Replayed[0] != plain) {
					return fmt.Errorf("replay: %+v, audit %+v", rs, audit)
				}
				return err
			}},
			{"forced replay", func() error {
				audit := outbox.ConsoleReplay{User: "alice", Role: "operator", Requested: []uuid.UUID{dead}}
				if _, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: dead}}, outbox.ReplayOptions{Force: true, Audit: &audit}); err == nil {
					return errors.New("a forced console replay was not refused")
				}
				return nil
			}},
			{"replays", func() error {
				rs, err := outbox.ConsoleReplays(ctx, tx, plain, 10)
				if err == nil && (len(rs) != 1 || rs[0].User != "alice" || rs[0].Replayed[0] != plain || rs[0].Refused != 1 ||
					len(rs[0].Requested) != 2 || rs[0].Remote != "192.0.2.1") {
					return fmt.Errorf("replays: %+v", rs)
				}
				return err
			}},
		}
		for _, s := range steps {
			if err := s.run(); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("as sendonce_console: %v", err)
	}
	for _, stmt := range []string{
		`SELECT to_e164 FROM sms_outbox LIMIT 1`,
		`SELECT body FROM sms_outbox LIMIT 1`,
		`DELETE FROM sms_outbox`,
		`INSERT INTO sms_outbox (id, to_e164, body) VALUES (gen_random_uuid(), '+15551234567', 'x')`,
		`UPDATE sms_outbox SET max_attempts = 1`,
		`UPDATE sendonce_console_audit SET username = 'mallory'`,
		`DELETE FROM sendonce_console_audit`,
		`DELETE FROM sms_attempts`,
		`INSERT INTO sms_evidence (outbox_id, kind, result, source) SELECT id, 'receipt', 'delivered', 'generic' FROM sms_outbox LIMIT 1`,
		`UPDATE sms_evidence SET result = 'delivered'`,
		`DELETE FROM sms_evidence`,
		`UPDATE sms_outbox SET lookup_pending = true`,
		// Replays only through its functions, and each one audited.
		`UPDATE sms_outbox SET status = 'pending', publish_gen = publish_gen + 1 WHERE status = 'dead'`,
		`SELECT id FROM sms_outbox FOR NO KEY UPDATE`,
		`INSERT INTO sendonce_console_audit (username, role, action, requested, replayed, refused) VALUES ('mallory', 'admin', 'replay', '{}', '{}', 0)`,
		`SELECT sendonce_apply_receipts('{}', '{}', '{}', '{}', '{}', '{}', '{}')`,
	} {
		err := asConsole(t, pool, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, stmt); return err })
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as sendonce_console: %v, want permission denied", stmt, err)
		}
	}
}

// What the console and the trace show of a row's free text has no terminal
// controls, bidi overrides or numbers, whoever wrote it.
func TestOperatorReadsCleanText(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	id := consoleRow(t, pool, outbox.StatusDead, time.Minute)
	const hostile = "\x1b[2J\u202eevil\u202c \u009b \u2066x\u2069 \u200f call +1 - 555 - 123 - 4567"
	if _, err := pool.Exec(ctx, `UPDATE sms_outbox SET last_error = $2, end_reason = 'permanent' WHERE id = $1`, id, hostile); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome, error) VALUES ($1, 1, now(), 'permanent', $2)`, id, hostile); err != nil {
		t.Fatal(err)
	}
	bad := func(s string) bool {
		return strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) ||
			strings.Contains(s, "4567")
	}
	m, err := outbox.MaskedRow(ctx, pool, id)
	if err != nil || bad(m.LastError) || !strings.Contains(m.LastError, "evil") {
		t.Errorf("MaskedRow: last error %q, %v", m.LastError, err)
	}
	r, err := outbox.GetRow(ctx, pool, id)
	if err != nil || bad(r.LastError) {
		t.Errorf("GetRow: last error %q, %v", r.LastError, err)
	}
	rows, err := outbox.DeadRows(ctx, pool, outbox.DeadFilter{}, 10)
	if err != nil || len(rows) != 1 || bad(rows[0].LastError) {
		t.Errorf("DeadRows: %+v, %v", rows, err)
	}
	as, err := outbox.Attempts(ctx, pool, id)
	if err != nil || len(as) != 1 || bad(as[0].Error) {
		t.Errorf("Attempts: %+v, %v", as, err)
	}
}
