package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce/internal/console"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
)

// The scans: every periodic read of the relay and the senders, and the
// console's pages, run once each on the history, through the product's
// own functions (internal/outbox), with the arguments and limits their
// callers use by default. auto_explain, loaded into the bench's session,
// sends each statement's plan with ANALYZE and BUFFERS to the bench as a
// notice, so a figure is what Postgres did for the statement the product
// sends, not for a copy of its text. Each step runs in a transaction that
// is rolled back: a claim locks and a mark writes nothing that stays.

// scanStep is one periodic read or console page.
type scanStep struct {
	name string
	// what says who runs it and how often.
	what string
	run  func(context.Context, pgx.Tx) error
}

// scanFigure is what one step cost.
type scanFigure struct {
	Name string `json:"name"`
	What string `json:"what"`
	// Statements is how many the step sent; Millis their execution time
	// as Postgres measured it (auto_explain's duration), Hit and Read the
	// shared buffers they found in Postgres's buffers and read from the
	// operating system.
	Statements int     `json:"statements"`
	Millis     float64 `json:"ms"`
	Hit        int64   `json:"buffers_hit"`
	Read       int64   `json:"buffers_read"`
	// SeqScans names the relations a plan read whole (nested statements
	// of functions included).
	SeqScans []string `json:"seq_scans,omitempty"`
	// Plans are auto_explain's, each with its duration.
	Plans []json.RawMessage `json:"plans"`
}

// explained is one plan auto_explain sent.
type explained struct {
	millis float64
	text   string
	plan   json.RawMessage
}

// explainConn is a connection whose statements' plans come back as
// notices; top holds the statements the bench itself sent (the others are
// statements of functions they called).
type explainConn struct {
	conn *pgx.Conn
	mu   sync.Mutex
	got  []explained
	top  map[string]bool
	err  error
}

// TraceQueryStart records a statement the bench sends.
func (e *explainConn) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	e.mu.Lock()
	e.top[strings.TrimSpace(d.SQL)] = true
	e.mu.Unlock()
	return ctx
}

// TraceQueryEnd is part of pgx.QueryTracer.
func (e *explainConn) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// notice takes auto_explain's notices: "duration: 1.234 ms  plan:\n{...}".
func (e *explainConn) notice(_ *pgconn.PgConn, n *pgconn.Notice) {
	rest, ok := strings.CutPrefix(n.Message, "duration: ")
	if !ok {
		return
	}
	ms, plan, ok := strings.Cut(rest, " ms  plan:")
	var x explained
	var err error
	if ok {
		x.millis, err = strconv.ParseFloat(ms, 64)
	}
	var p struct {
		Text string          `json:"Query Text"`
		Plan json.RawMessage `json:"Plan"`
	}
	if err == nil && ok {
		err = json.Unmarshal([]byte(plan), &p)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !ok || err != nil {
		e.err = fmt.Errorf("auto_explain notice not understood (%v): %.80q", err, n.Message)
		return
	}
	x.text, x.plan = strings.TrimSpace(p.Text), p.Plan
	e.got = append(e.got, x)
}

// explainOn connects to url and loads auto_explain into the session, its
// plans sent to the client as notices.
func explainOn(ctx context.Context, url string) (*explainConn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	e := &explainConn{top: map[string]bool{}}
	cfg.OnNotice = e.notice
	cfg.Tracer = e
	if e.conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return nil, err
	}
	for _, q := range []string{
		`LOAD 'auto_explain'`,
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_analyze = on`,
		`SET auto_explain.log_buffers = on`,
		`SET auto_explain.log_timing = on`,
		`SET auto_explain.log_nested_statements = on`,
		`SET auto_explain.log_format = json`,
		`SET auto_explain.log_level = notice`,
	} {
		if _, err := e.conn.Exec(ctx, q); err != nil {
			_ = e.conn.Close(ctx)
			return nil, fmt.Errorf("%s (auto_explain needs a superuser, or its library in plugins/): %w", q, err)
		}
	}
	return e, nil
}

// measure runs step in a transaction it rolls back and sums what the
// statements the bench sent cost.
func (e *explainConn) measure(ctx context.Context, step scanStep) (scanFigure, error) {
	f := scanFigure{Name: step.name, What: step.what}
	e.mu.Lock()
	e.got, e.top, e.err = nil, map[string]bool{}, nil
	e.mu.Unlock()
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		return f, err
	}
	err = step.run(ctx, tx)
	if rerr := tx.Rollback(ctx); err == nil {
		err = rerr
	}
	if err != nil {
		return f, fmt.Errorf("%s: %w", step.name, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return f, fmt.Errorf("%s: %w", step.name, e.err)
	}
	seq := map[string]bool{}
	for _, x := range e.got {
		var n planNode
		if err := json.Unmarshal(x.plan, &n); err != nil {
			return f, fmt.Errorf("%s: plan: %w", step.name, err)
		}
		n.seqScans(seq)
		f.Plans = append(f.Plans, json.RawMessage(fmt.Sprintf(`{"ms": %g, "query": %s, "plan": %s}`, x.millis, quoteJSON(x.text), x.plan)))
		if !e.top[x.text] {
			continue
		}
		f.Statements++
		f.Millis += x.millis
		f.Hit += n.Hit
		f.Read += n.Read
	}
	if f.Statements == 0 {
		return f, fmt.Errorf("%s: no plan of a statement it sent came back", step.name)
	}
	for r := range seq {
		f.SeqScans = append(f.SeqScans, r)
	}
	return f, nil
}

// quoteJSON returns s as a JSON string.
func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// planNode is the part of an EXPLAIN (FORMAT JSON) node the bench reads;
// a node's buffers include its children's.
type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Schema   string     `json:"Schema"`
	Hit      int64      `json:"Shared Hit Blocks"`
	Read     int64      `json:"Shared Read Blocks"`
	Plans    []planNode `json:"Plans"`
}

// seqScans adds the relations n and its children read whole.
func (n *planNode) seqScans(into map[string]bool) {
	if n.Type == "Seq Scan" {
		into[n.Relation] = true
	}
	for i := range n.Plans {
		n.Plans[i].seqScans(into)
	}
}

// scanSteps are the steps, on an outbox whose rows include the one named
// id (a finished row, for the message's page and trace).
func scanSteps(id uuid.UUID) []scanStep {
	now := time.Now()
	hour := now.Add(-time.Hour).Truncate(time.Second)
	const windowLimit = 500_000 // the console's bound of its hour and day counts
	return []scanStep{
		{"relay: claim of pending rows", "every relay, each batch (here none is pending)", func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.ClaimPending(ctx, tx, relay.DefaultBatchSize)
			return err
		}},
		{"relay: due and expiring rows", "every relay, every RELAY_TIME_INTERVAL (250 ms)", func(ctx context.Context, tx pgx.Tx) error {
			_, _, err := outbox.PromoteDue(ctx, tx, relay.DefaultBatchSize)
			return err
		}},
		{"relay: gauges", "every relay's monitor, every 15 s: the oldest pending, in-flight, finished and urgent rows, the counts of pending, queued and sending rows (up to 100,000 each), the tables' sizes", func(ctx context.Context, tx pgx.Tx) error {
			for _, f := range []func(context.Context, outbox.Querier) (time.Duration, error){outbox.OldestPendingAge, outbox.OldestInFlightAge, outbox.OldestPurgeableAge, outbox.OldestUrgent} {
				if _, err := f(ctx, tx); err != nil {
					return err
				}
			}
			for _, s := range []outbox.State{outbox.StatusPending, outbox.StatusQueued, outbox.StatusSending} {
				if _, err := outbox.CountUpTo(ctx, tx, s, 100_000); err != nil {
					return err
				}
			}
			_, err := outbox.Tables(ctx, tx)
			return err
		}},
		{"reconciler: stuck rows", "one relay's reconciler, every 30 s", func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.ClaimStuck(ctx, tx, 2*time.Minute, [3]uint64{}, 0, 100)
			return err
		}},
		{"reconciler: rows without their dead letter", "one relay's reconciler, every 30 s", func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.ClaimUnlettered(ctx, tx, 30*time.Second, 100)
			return err
		}},
		{"overdue sweep: mark", "every sender with lookups, a chunk of 5,000 final rows at a time as the overdue time passes", func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.MarkOverdue(ctx, tx, time.Time{}, sender.DefaultReceiptOverdue, sender.DefaultReceiptOverdue, 5000, true)
			return err
		}},
		{"overdue sweep: claim", "every sender with lookups, when a look is due", func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.ClaimOverdue(ctx, tx, 10, []time.Duration{time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 16 * time.Hour}, time.Minute)
			return err
		}},
		{"retention: purge step", "one relay, every RETENTION_INTERVAL (1 min), 1,000 rows a statement (here none is old enough)", func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.Purge(ctx, tx, relay.DefaultRetentionAge, 1000)
			return err
		}},
		{"console: overview", "each load of the console's first page", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := outbox.CountStatuses(ctx, tx, console.DefaultExactBelow); err != nil {
				return err
			}
			for _, since := range []time.Time{now.Add(-time.Hour), now.Add(-24 * time.Hour)} {
				if _, err := outbox.CountChanged(ctx, tx, since, windowLimit); err != nil {
					return err
				}
			}
			if _, _, err := outbox.OldestRows(ctx, tx); err != nil {
				return err
			}
			if _, err := outbox.OldestUrgent(ctx, tx); err != nil {
				return err
			}
			if _, err := outbox.AttemptsPerMinute(ctx, tx, hour); err != nil {
				return err
			}
			if _, err := outbox.DeadByReason(ctx, tx, hour); err != nil {
				return err
			}
			_, err := outbox.ProviderShares(ctx, tx, hour)
			return err
		}},
		{"console: dead and unknown rows", "each load of the console's dead-letter page", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := outbox.DeadRows(ctx, tx, outbox.DeadFilter{}, console.DefaultPageSize); err != nil {
				return err
			}
			if _, err := outbox.SummarizeDead(ctx, tx, outbox.DeadFilter{}, 10_000); err != nil {
				return err
			}
			_, err := outbox.ConsoleReplays(ctx, tx, uuid.Nil, 10)
			return err
		}},
		{"console: a message", "each load of a message's page: the row, its attempts, its replays", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := outbox.MaskedRow(ctx, tx, id); err != nil {
				return err
			}
			if _, err := outbox.Attempts(ctx, tx, id); err != nil {
				return err
			}
			_, err := outbox.ConsoleReplays(ctx, tx, id, 100)
			return err
		}},
		{"relay trace: a message's timeline", "each relay trace: the row, its attempts, its suppression, its evidence", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := outbox.GetRow(ctx, tx, id); err != nil {
				return err
			}
			if _, err := outbox.Attempts(ctx, tx, id); err != nil {
				return err
			}
			if _, err := outbox.SuppressionOf(ctx, tx, id); err != nil {
				return err
			}
			_, err := outbox.EvidenceOf(ctx, tx, id)
			return err
		}},
	}
}

// scans measures every step on f's outbox, twice, and returns the figures
// of each pass.
func (b *bench) scans(ctx context.Context, f *future) (cold, warm []scanFigure, err error) {
	var id uuid.UUID
	// A delivered row from the middle of the history.
	err = f.at.pool.QueryRow(ctx, `SELECT id FROM sms_outbox WHERE xmin = $1::text::xid AND status = 'delivered'
		AND created_at < now() - interval '3 days' ORDER BY created_at DESC LIMIT 1`, f.at.keepXmin).Scan(&id)
	if err != nil {
		return nil, nil, fmt.Errorf("pick a delivered row: %w", err)
	}
	e, err := explainOn(ctx, f.at.url)
	if err != nil {
		return nil, nil, err
	}
	defer e.conn.Close(context.WithoutCancel(ctx))
	// Twice: the first pass finds the pages where the load and the
	// checkpoint left them; the second, as a read that runs every few
	// seconds does.
	for pass := range 2 {
		for _, st := range scanSteps(id) {
			sf, err := e.measure(ctx, st)
			if err != nil {
				return nil, nil, err
			}
			seq := ""
			if len(sf.SeqScans) > 0 {
				seq = "; read whole: " + strings.Join(sf.SeqScans, ", ")
			}
			b.logf("[history] pass %d, %s: %d statements, %.2f ms, %d buffers hit, %d read%s", pass+1, sf.Name, sf.Statements, sf.Millis, sf.Hit, sf.Read, seq)
			if pass == 0 {
				cold = append(cold, sf)
			} else {
				warm = append(warm, sf)
			}
		}
	}
	return cold, warm, nil
}

// wholeReads counts the steps whose plans read one of the tables that
// grow with the traffic whole.
func wholeReads(fs []scanFigure) int {
	n := 0
	for _, f := range fs {
		for _, r := range f.SeqScans {
			if r == "sms_outbox" || r == "sms_attempts" || r == "sms_evidence" {
				n++
				break
			}
		}
	}
	return n
}
