package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The history scenario: a week of finished rows must cost today's traffic
// little. Then commit->sent at -rate is measured once on each table, as
// the latency scenario does. The pipeline's drain runs -runs times on each of two outboxes,
// interleaved, as for the schedule scenario: empty (the bench's own
// tables, emptied before the side) and beside -history-rows finished rows
// with their attempts and receipts (the product's tables migrated into
// historySchema, loaded once). Before each side beside them, the last
// side's rows are deleted with their attempts and evidence, and the
// tables vacuumed.

// historySchema holds the outbox with the history. It is dropped when the
// scenario ends (and before it starts, after a bench that died).
const historySchema = "sendonce_history"

// historyDays is how far back the history's rows were made: the default
// retention (relay.DefaultRetentionAge), which keeps a finished row a
// week after its last change.
const historyDays = 7

// The history's mix, per 1,000 rows: the rest are delivered.
const (
	historySent        = 40 // a receipt never came
	historyUndelivered = 40
	historyDead        = 15
	historyUnknown     = 5
	historyRetried     = 50 // rows with a retry before their last attempt
)

// loadHistory writes n finished rows into the outbox pool's search_path
// finds, with their attempts and their receipts, in one transaction, and
// returns its id: the xmin of every row it wrote. Rows are made evenly
// over the historyDays before the load less an hour (so that retention,
// which runs in the relay, purges none of them during the bench), oldest
// first, each finished
// seconds after it was made. Per 1,000 rows: 900 delivered, 40 sent (no
// receipt came), 40 undelivered, 15 dead (a permanent refusal), 5 unknown
// (an ambiguous answer, lettered); 50 of them retried once first. Every
// row has one attempt per call and a receipt where one came. Ids are
// version 7 UUIDs of the row's creation, as the outbox mints them, with
// the rest of the bits from the row's number (so the attempts and
// receipts, written by their own statements, name the same ids).
// Numbers are fictitious and never logged.
func loadHistory(ctx context.Context, pool *pgxpool.Pool, n int) (string, error) {
	return loadHistoryOf(ctx, pool, n, true)
}

// loadHistoryOf is loadHistory; logs false writes the rows alone, without
// their attempts and receipts (a faster load, for tests of the plans on
// sms_outbox).
func loadHistoryOf(ctx context.Context, pool *pgxpool.Pool, n int, logs bool) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// h: the rows by number g, with their creation time, id and status.
	const h = `
		WITH h AS (
			SELECT g, made, m,
			       pg_catalog.encode(pg_catalog.set_bit(pg_catalog.set_bit(overlay(
			           pg_catalog.decode(pg_catalog.md5(g::text), 'hex')
			           PLACING substring(pg_catalog.int8send((extract(epoch FROM made) * 1000)::bigint) FROM 3)
			           FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid AS id,
			       CASE WHEN m < $3 THEN 'sent'
			            WHEN m < $3 + $4 THEN 'undelivered'
			            WHEN m < $3 + $4 + $5 THEN 'dead'
			            WHEN m < $3 + $4 + $5 + $6 THEN 'unknown'
			            ELSE 'delivered' END AS st,
			       g % 1000 >= 1000 - $7 AS retried
			FROM (SELECT g, g % 1000 AS m,
			             now() - ($2 * interval '1 day' - interval '1 hour') * (1 - g::float8 / $1) AS made
			      FROM generate_series(1, $1::int) AS g) AS r
		)`
	steps := []struct{ what, sql string }{
		{"rows", h + `
		INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count, publish_gen, next_attempt_at,
		                        last_error, provider_ref, created_at, updated_at, stream_seq, maybe_accepted,
		                        claim_id, lease_until, end_reason, letter_seq, sent_at, claim_seq,
		                        claim_delivery, provider, finished_at)
		SELECT id, '+1555' || lpad((g % 10000000)::text, 7, '0'),
		       'Your sendonce bench code is ' || lpad((g % 1000000)::text, 6, '0') || '. It expires in 10 minutes.',
		       st, CASE WHEN retried THEN 2 ELSE 1 END, 1, made,
		       CASE st WHEN 'undelivered' THEN 'receipt: undelivered (30003)'
		               WHEN 'dead' THEN 'provider: 400 invalid number (21211)'
		               WHEN 'unknown' THEN 'read timeout after the request was sent' END,
		       CASE WHEN st IN ('sent', 'delivered', 'undelivered') THEN 'SM' || pg_catalog.md5(id::text) END,
		       made, made + interval '3 seconds', g, st = 'unknown',
		       id, made + interval '31 seconds', CASE st WHEN 'dead' THEN 'permanent' WHEN 'unknown' THEN 'ambiguous' END,
		       CASE WHEN st IN ('dead', 'unknown') THEN g END,
		       CASE WHEN st IN ('sent', 'delivered', 'undelivered') THEN made + interval '1 second' END,
		       g, 1, 'generic',
		       CASE WHEN st <> 'unknown' THEN made + interval '3 seconds' END
		FROM h`},
		{"attempts", h + `
		INSERT INTO sms_attempts (outbox_id, attempt, started_at, latency_ms, outcome, http_status, provider_code, error, sender, provider)
		SELECT id, a, made + (a - 1) * interval '2 seconds', 40 + (g % 80),
		       CASE WHEN a < last THEN 'retry'
		            WHEN st = 'dead' THEN 'permanent' WHEN st = 'unknown' THEN 'ambiguous' ELSE 'sent' END,
		       CASE WHEN a < last THEN 503 WHEN st = 'dead' THEN 400 WHEN st = 'unknown' THEN NULL ELSE 201 END,
		       CASE WHEN a = last AND st = 'dead' THEN 21211 END,
		       CASE WHEN a < last THEN 'provider: 503' WHEN st = 'dead' THEN 'provider: 400 invalid number (21211)'
		            WHEN st = 'unknown' THEN 'read timeout after the request was sent' END,
		       'bench-sender', 'generic'
		FROM h, LATERAL (SELECT CASE WHEN retried THEN 2 ELSE 1 END AS last) AS l,
		     LATERAL generate_series(1, l.last) AS a`},
		{"receipts", h + `
		INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, code, reported_at, received_at, source)
		SELECT id, 'receipt', st, 'SM' || pg_catalog.md5(id::text), CASE st WHEN 'undelivered' THEN 30003 END,
		       made + interval '2 seconds', made + interval '3 seconds', 'generic'
		FROM h WHERE st IN ('delivered', 'undelivered')`},
	}
	if !logs {
		steps = steps[:1]
	}
	for _, s := range steps {
		if _, err := tx.Exec(ctx, s.sql, n, historyDays, historySent, historyUndelivered, historyDead, historyUnknown, historyRetried); err != nil {
			return "", fmt.Errorf("load %d finished rows: %s: %w", n, s.what, err)
		}
	}
	var xmin string
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.txid_current()::text`).Scan(&xmin); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("load %d finished rows: %w", n, err)
	}
	// txid_current is the 64-bit id; xmin the 32 bits of it.
	var x uint64
	if _, err := fmt.Sscan(xmin, &x); err != nil {
		return "", err
	}
	return fmt.Sprint(x & 0xffffffff), nil
}

// Sides of the history scenario.
const (
	sideEmpty   = "pipeline on an empty table"
	sideHistory = "pipeline beside the history"
)

// historyReport is the history scenario in bench.json.
type historyReport struct {
	Method string `json:"method"`
	// Rows finished rows (with Attempts attempts and Receipts receipts)
	// were loaded in LoadSeconds by Load; Sizes are the tables' and
	// indexes' bytes after it.
	Rows        int              `json:"history_rows"`
	Attempts    int64            `json:"attempts"`
	Receipts    int64            `json:"receipts"`
	LoadSeconds float64          `json:"load_seconds"`
	Load        string           `json:"load"`
	Sizes       map[string]int64 `json:"sizes"`
	Autovacuum  string           `json:"autovacuum"`
	// Backlog is each side's pending rows, drained Runs times a side.
	Backlog int `json:"backlog"`
	Runs    int `json:"runs"`
	// Empty and History are the sides' runs and medians; Ratio is
	// History's median over Empty's, CPURatio and WALRatio the same for
	// Postgres's CPU and WAL bytes per message.
	Empty    sideSummary `json:"empty"`
	History  sideSummary `json:"history"`
	Ratio    float64     `json:"ratio"`
	CPURatio float64     `json:"postgres_cpu_ratio"`
	WALRatio float64     `json:"wal_ratio"`
	// LatencyEmpty and LatencyHistory are commit->sent at -rate on each.
	LatencyEmpty   *historyLatency `json:"latency_empty,omitempty"`
	LatencyHistory *historyLatency `json:"latency_history,omitempty"`
	// ScansFirst and Scans are the periodic reads and the console's pages
	// on the history, a first and a second time.
	ScansFirst []scanFigure `json:"scans_first"`
	Scans      []scanFigure `json:"scans"`
	// Untouched is the check of the history after each side beside it.
	Untouched []untouchedCheck `json:"untouched"`
}

// historyLatency is one latency run of the history scenario.
type historyLatency struct {
	CommitsPerSecond float64        `json:"commits_per_second"`
	CommitToSent     latencySummary `json:"commit_to_sent"`
}

// history runs the scenario's sides, -runs times each and interleaved,
// then the latency on each table, then the scans (scans.go), each under
// its own -timeout, and adds the figures. A side that fails is
// left out of its medians; its error is returned.
func (b *bench) history(ctx context.Context, rep *report) []error {
	c := b.cfg
	lctx, cancel := context.WithTimeout(ctx, c.historyTimeout)
	f, err := b.setupKept(lctx, historySchema, "history", fmt.Sprintf("%d finished rows, their attempts and receipts", c.historyRows), c.historyRows, true, loadHistory)
	cancel()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := b.dropFuture(dctx, f); err != nil {
			b.logf("[history] %v", err)
		}
	}()
	if err != nil {
		return []error{fmt.Errorf("history: %w", err)}
	}
	hr := &historyReport{Rows: f.rows, LoadSeconds: f.load.Seconds(), Backlog: c.pipeRows, Runs: c.runs, Sizes: map[string]int64{},
		Load: fmt.Sprintf("one transaction of three INSERT ... SELECT generate_series (rows, attempts, receipts), made over the %d days before the load; then VACUUM (ANALYZE) and CHECKPOINT", historyDays),
		Method: "each run drains the pipeline's backlog (pending rows written with COPY, 1 relay, -senders senders, the stub without latency) on an empty table, then beside the history, each on a fresh NATS server and stub: " +
			"empty, on the bench's own tables emptied by TRUNCATE; beside, on a second copy of the product's tables in schema " + historySchema + " of the same database, holding the history, " +
			"from which the last side's rows are deleted (with their attempts and evidence) and which is vacuumed before the side; each figure is the median of its runs, the ratios history / empty of the medians"}
	if err := b.historySizes(ctx, f, hr); err != nil {
		return []error{fmt.Errorf("history: %w", err)}
	}
	results, checks, errs := b.interleave(ctx, rep, "history", f, [2]string{sideEmpty, sideHistory}, [2]string{"empty", "beside"}, false)
	if ctx.Err() != nil {
		return errs
	}
	hr.Untouched = checks
	// Commit->sent at -rate, once on each table.
	for _, side := range []string{sideEmpty, sideHistory} {
		if ctx.Err() != nil {
			return append(errs, ctx.Err())
		}
		name, on := "history-latency-empty", (*outboxAt)(nil)
		if side == sideHistory {
			name, on = "history-latency-beside", &f.at
		}
		b.logf("[history] commit->sent at %d/s: %s", c.rate, side)
		sctx, cancel := context.WithTimeout(ctx, c.timeout)
		l, err := b.latencyOn(sctx, rep, name, on)
		cancel()
		b.stopAll()
		if err != nil {
			b.logf("[history: %s, latency] FAILED: %v", side, err)
			errs = append(errs, fmt.Errorf("history: %s, latency: %w", side, err))
			continue
		}
		lat := &historyLatency{CommitsPerSecond: l.achieved, CommitToSent: l.sent}
		if side == sideHistory {
			hr.LatencyHistory = lat
		} else {
			hr.LatencyEmpty = lat
		}
	}
	// Last: a step's rolled-back lock or mark leaves its transaction's id
	// on the rows it took, which the checks above would count.
	if ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, c.timeout)
		hr.ScansFirst, hr.Scans, err = b.scans(sctx, f)
		cancel()
		if err != nil {
			b.logf("[history: scans] FAILED: %v", err)
			errs = append(errs, fmt.Errorf("history: scans: %w", err))
		}
	}
	hr.Empty, hr.History = summarizeSide(sideEmpty, results[sideEmpty]), summarizeSide(sideHistory, results[sideHistory])
	hr.Ratio = ratio(hr.History.Rate, hr.Empty.Rate)
	hr.CPURatio = ratio(hr.History.PostgresCPUMicros, hr.Empty.PostgresCPUMicros)
	hr.WALRatio = ratio(hr.History.WALBytes, hr.Empty.WALBytes)
	b.logf("[history] empty: median %.0f msg/s of %v, %.0f µs; beside %d finished rows: median %.0f msg/s of %v, %.0f µs; %.2fx, CPU %.2fx",
		hr.Empty.Rate, roundAll(hr.Empty.Rates), hr.Empty.PostgresCPUMicros, f.rows, hr.History.Rate, roundAll(hr.History.Rates), hr.History.PostgresCPUMicros, hr.Ratio, hr.CPURatio)
	rep.addHistory(hr, len(results[sideEmpty]) > 0 && len(results[sideHistory]) > 0)
	return errs
}

// historySizes reads how many attempts and receipts the load wrote, the
// sizes of the history's tables and indexes, and the server's autovacuum.
func (b *bench) historySizes(ctx context.Context, f *future, hr *historyReport) error {
	p := f.at.pool
	if err := p.QueryRow(ctx, `SELECT (SELECT count(*) FROM sms_attempts), (SELECT count(*) FROM sms_evidence), current_setting('autovacuum')`).
		Scan(&hr.Attempts, &hr.Receipts, &hr.Autovacuum); err != nil {
		return fmt.Errorf("read the history's size: %w", err)
	}
	rows, err := p.Query(ctx, `SELECT c.relname, pg_catalog.pg_relation_size(c.oid)
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'i') AND c.relname LIKE 'sms\_%'`, f.schema)
	if err != nil {
		return fmt.Errorf("read the history's sizes: %w", err)
	}
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			return err
		}
		hr.Sizes[name] = size
		total += size
	}
	if err := rows.Err(); err != nil {
		return err
	}
	b.logf("[history] %d rows, %d attempts, %d receipts: %.0f MB of tables and indexes; autovacuum %s", hr.Rows, hr.Attempts, hr.Receipts, float64(total)/1e6, hr.Autovacuum)
	return nil
}

// addHistory adds the history scenario's figures: each side's median and
// Postgres's work per message, their ratios, and what touched the
// history; sides says both sides have runs.
func (r *report) addHistory(h *historyReport, sides bool) {
	r.History = h
	if sides {
		beside := fmt.Sprintf("beside %s finished rows", thousands(int64(h.Rows)))
		for _, side := range []struct {
			name string
			sum  sideSummary
		}{{"on an empty table", h.Empty}, {beside, h.History}} {
			r.add("history", fmt.Sprintf("pipeline %s: drain %s pending->sent, median of %d", side.name, thousands(int64(h.Backlog)), len(side.sum.Rates)), side.sum.Rate, "msg/s")
			r.add("history", "postgres CPU per message, "+side.name, side.sum.PostgresCPUMicros, "µs")
			r.add("history", "WAL bytes per message, "+side.name, side.sum.WALBytes, "B")
		}
		r.addTarget("history", "pipeline "+beside+" / empty", h.Ratio, "x", ">=", 0.9)
		r.addTarget("history", "postgres CPU per message, "+beside+" / empty", h.CPURatio, "x", "<=", 1.15)
	}
	if h.LatencyEmpty != nil && h.LatencyHistory != nil {
		e, l := h.LatencyEmpty, h.LatencyHistory
		r.add("history", fmt.Sprintf("commit->sent p99 @%.0f commits/s, empty table", e.CommitsPerSecond), e.CommitToSent.P99, "ms")
		r.add("history", fmt.Sprintf("commit->sent p99 @%.0f commits/s, beside %s finished rows", l.CommitsPerSecond, thousands(int64(h.Rows))), l.CommitToSent.P99, "ms")
		r.addTarget("history", "commit->sent p99, beside the history / empty", ratio(l.CommitToSent.P99, e.CommitToSent.P99), "x", "<=", 1.2)
	}
	for _, f := range h.Scans {
		r.add("history", fmt.Sprintf("%s, beside %s finished rows: time", f.Name, thousands(int64(h.Rows))), f.Millis, "ms")
		r.add("history", fmt.Sprintf("%s: buffers", f.Name), float64(f.Hit+f.Read), "buffers")
	}
	if len(h.Scans) > 0 {
		r.addTarget("history", "periodic reads and console pages that read sms_outbox, sms_attempts or sms_evidence whole", float64(wholeReads(h.Scans)), "steps", "<=", 0)
	}
	var touched int64
	for _, u := range h.Untouched {
		touched += u.touched()
	}
	if len(h.Untouched) > 0 {
		r.addTarget("history", "finished rows changed or locked, "+plural(len(h.Untouched), "check"), float64(touched), "rows", "<=", 0)
	}
}
