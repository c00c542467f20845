package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// The schedule scenario: rows scheduled for tomorrow must cost today's
// traffic nothing, and rows that come due must be sent on time.
//
// The pipeline's drain runs -runs times on each of two outboxes in the
// bench database, interleaved: without (the bench's own tables, emptied
// before the side, as for the pipeline scenario) and beside
// -scheduled-rows rows scheduled for tomorrow (the product's tables
// migrated into a schema of their own, futureSchema). The scheduled rows
// are loaded once, before the runs, and stay: before each side beside
// them, every other row is deleted and the table vacuumed, so each side
// starts from the same table. Both outboxes share the server, the
// database (its statistics, WAL and backends are counted as for every
// other side) and the role; only the million rows differ.
//
// Then rows scheduled a few seconds ahead come due while writers commit
// at -rate beside the scheduled rows: the time from each one's send_at
// to the stub's taking of its request.

const (
	// futureSchema holds the outbox with the scheduled rows. It is
	// dropped when the scenario ends (and before it starts, after a bench
	// that died).
	futureSchema = "sendonce_future"
	// dueLead is how long after the due rows are written the first of
	// them comes due.
	dueLead = 3 * time.Second
	// dueSettle is how long the writers run before the due rows are
	// written, and after the last of them is due.
	dueSettle = time.Second
)

// outboxAt is an outbox in a schema of its own, for the relay, the
// senders and the bench.
type outboxAt struct {
	// url is the processes' DATABASE_URL: the bench's, with the schema as
	// search_path.
	url string
	// pool is the bench's connections with that search_path; table names
	// the outbox for the bench's own pool.
	pool  *pgxpool.Pool
	table string
	// keepXmin is the transaction id of the rows the outbox keeps between
	// sides (its scheduled rows, or its history).
	keepXmin string
	// keepLogs keeps the attempts and evidence of the kept rows too (the
	// history's); otherwise the logs are emptied whole.
	keepLogs bool
	// lastKept is the greatest id of the kept rows: a side's rows, minted
	// later (rowID), have greater ones, so a side's reads of its own rows
	// take them by a range of the primary key, never the kept ones.
	lastKept string
}

// sideRows is an expression naming the rows of a side in o, for the
// bench's reads: `FROM ` + o.sideRows() + ` WHERE status = ...`.
func (o *outboxAt) sideRows() string {
	if o.lastKept == "" {
		return o.table
	}
	return "(SELECT * FROM " + o.table + " WHERE id > '" + o.lastKept + "'::uuid) AS side"
}

// empty deletes every row but the kept ones, with the attempts log and
// the evidence, and vacuums the outbox so that the next side's rows find
// the space the last side's left, as in a table whose rows come and go.
func (o *outboxAt) empty(ctx context.Context) error {
	vacuum := `VACUUM sms_outbox`
	if o.keepLogs {
		// The delete takes the side's attempts and evidence with its
		// rows (ON DELETE CASCADE), by their outbox_id index.
		vacuum = `VACUUM sms_outbox, sms_attempts, sms_evidence`
	} else if _, err := o.pool.Exec(ctx, `TRUNCATE sms_evidence, sms_attempts`); err != nil {
		return fmt.Errorf("empty %s: %w", o.table, err)
	}
	del := `DELETE FROM sms_outbox WHERE xmin <> $1::text::xid`
	args := []any{o.keepXmin}
	if o.lastKept != "" {
		del, args = `DELETE FROM sms_outbox WHERE id > $1::uuid`, []any{o.lastKept}
	}
	if _, err := o.pool.Exec(ctx, del, args...); err != nil {
		return fmt.Errorf("empty %s: %w", o.table, err)
	}
	if _, err := o.pool.Exec(ctx, vacuum); err != nil {
		return fmt.Errorf("vacuum %s: %w", o.table, err)
	}
	return nil
}

// future is an outbox in a schema of its own with rows loaded once, kept
// between sides: the scheduled rows, or the history.
type future struct {
	at     outboxAt
	schema string
	// rows is how many were loaded, in load.
	rows int
	load time.Duration
}

// withSearchPath returns the postgres:// URL u with schema as its
// search_path (a run-time parameter of every connection).
func withSearchPath(u, schema string) (string, error) {
	p, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	q := p.Query()
	q.Set("search_path", schema)
	p.RawQuery = q.Encode()
	return p.String(), nil
}

// setupFuture migrates futureSchema and loads its scheduled rows with one
// INSERT ... SELECT generate_series: status scheduled, send_at spread
// over the 24 hours starting a day from now.
func (b *bench) setupFuture(ctx context.Context) (*future, error) {
	return b.setupKept(ctx, futureSchema, "schedule", fmt.Sprintf("%d rows scheduled for tomorrow", b.cfg.scheduledRows), b.cfg.scheduledRows, false, loadScheduled)
}

// setupKept migrates the product's tables into schema and loads n rows
// with load, which returns the loading transaction's id. It then vacuums
// and analyzes the tables (as autovacuum would have done since) and
// checkpoints, so that the load leaves no dirty buffers behind.
func (b *bench) setupKept(ctx context.Context, schema, tag, what string, n int, keepLogs bool,
	load func(context.Context, *pgxpool.Pool, int) (string, error)) (*future, error) {
	c := b.cfg
	if err := b.dropFuture(ctx, &future{schema: schema}); err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", schema, err)
	}
	u, err := withSearchPath(c.databaseURL, schema)
	if err != nil {
		return nil, err
	}
	if _, err := proc.Run(ctx, filepath.Join(c.binDir, "relay"), []string{"migrate"},
		[]string{"DATABASE_URL=" + u, "LOG_FORMAT=text", "LOG_LEVEL=warn"}); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(c.writers + 4)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	f := &future{at: outboxAt{url: u, pool: pool, table: schema + ".sms_outbox", keepLogs: keepLogs}, schema: schema, rows: n}
	b.logf("[%s] loading %s into %s", tag, what, f.at.table)
	t := time.Now()
	if f.at.keepXmin, err = load(ctx, pool, f.rows); err != nil {
		return f, err
	}
	f.load = time.Since(t)
	if err := pool.QueryRow(ctx, `SELECT id::text FROM sms_outbox ORDER BY id DESC LIMIT 1`).Scan(&f.at.lastKept); err != nil {
		return f, fmt.Errorf("read the last loaded id: %w", err)
	}
	t = time.Now()
	for _, q := range []string{`VACUUM (ANALYZE) sms_outbox, sms_attempts, sms_evidence`, `CHECKPOINT`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return f, fmt.Errorf("%s: %w", q, err)
		}
	}
	b.logf("[%s] %d rows loaded in %s; vacuumed, analyzed and checkpointed in %s", tag, f.rows, f.load.Round(time.Millisecond), since(t))
	return f, nil
}

// loadScheduled writes n rows scheduled for tomorrow into the outbox
// pool's search_path finds, in one statement, and returns its transaction
// id: the xmin of every row it wrote, as long as no one changes them.
// Numbers are fictitious and never logged.
func loadScheduled(ctx context.Context, pool *pgxpool.Pool, n int) (string, error) {
	var xmin string
	err := pool.QueryRow(ctx, `WITH loaded AS (
			INSERT INTO sms_outbox (id, to_e164, body, status, send_at)
			SELECT -- a version 7 UUID of the load's time, as the outbox mints them
			       pg_catalog.encode(pg_catalog.set_bit(pg_catalog.set_bit(overlay(
			           pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
			           PLACING substring(pg_catalog.int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
			           FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid,
			       '+1555' || lpad((g % 10000000)::text, 7, '0'),
			       'Your sendonce bench reminder ' || g || ' is tomorrow.', 'scheduled',
			       now() + interval '1 day' + (g * 86400.0 / $1) * interval '1 second'
			FROM generate_series(1, $1::int) AS g
			RETURNING xmin::text AS xmin
		)
		SELECT min(xmin), count(*) FROM loaded`, n).Scan(&xmin, new(int))
	if err != nil {
		return "", fmt.Errorf("load %d scheduled rows: %w", n, err)
	}
	return xmin, nil
}

// dropFuture drops f's schema and closes its pool, if any.
func (b *bench) dropFuture(ctx context.Context, f *future) error {
	if f == nil {
		return nil
	}
	if f.at.pool != nil {
		f.at.pool.Close()
	}
	if _, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+f.schema+` CASCADE`); err != nil {
		return fmt.Errorf("drop schema %s: %w", f.schema, err)
	}
	return nil
}

// untouchedCheck is what became of the scheduled rows, read after a side:
// a row changed has a new version (another xmin), one claimed was locked
// (xmax set on the version loaded).
type untouchedCheck struct {
	// Rows is how many were loaded; Intact how many still are the loaded
	// version and were never locked.
	Rows   int64 `json:"rows"`
	Intact int64 `json:"intact"`
	// Changed counts rows with a version newer than the loaded one;
	// Locked, loaded versions locked (or changed by a transaction that
	// rolled back).
	Changed int64 `json:"changed"`
	Locked  int64 `json:"locked"`
}

// touched is how many scheduled rows were changed or locked.
func (u untouchedCheck) touched() int64 { return u.Changed + u.Locked }

// checkUntouched reads every version of f's table (a scan of the whole
// table: the loaded versions are known by their xmin alone).
func (b *bench) checkUntouched(ctx context.Context, f *future) (untouchedCheck, error) {
	u := untouchedCheck{Rows: int64(f.rows)}
	var loaded int64
	// The load's own transaction may have locked its rows (the foreign
	// keys of the history's attempts and receipts do).
	err := f.at.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE xmax <> '0'::xid AND xmax <> $1::text::xid)
		FROM sms_outbox WHERE xmin = $1::text::xid`, f.at.keepXmin).Scan(&loaded, &u.Locked)
	if err != nil {
		return u, fmt.Errorf("check the scheduled rows: %w", err)
	}
	u.Changed = u.Rows - loaded
	u.Intact = loaded - u.Locked
	return u, nil
}

// flowCount is what the stream, its consumers, the relay and the senders
// counted over one drain of Backlog rows: a scheduled row published,
// promoted, delivered or claimed would show as more than the backlog.
type flowCount struct {
	Backlog int64 `json:"backlog"`
	// StreamMessages is the work stream's messages; Deliveries the
	// deliveries of every lane's consumer, redeliveries included.
	StreamMessages int64 `json:"stream_messages"`
	Deliveries     int64 `json:"consumer_deliveries"`
	// Published is the relay's sendonce_relay_published_total; Promoted
	// its sendonce_relay_timed_rows_total{what="due"}, the scheduled rows
	// it made pending.
	Published int64 `json:"relay_published"`
	Promoted  int64 `json:"relay_promoted"`
	// Attempts is the senders' claims of the sent rows (attempt_count);
	// ProviderRequests the stub's requests.
	Attempts         int64 `json:"attempts"`
	ProviderRequests int64 `json:"provider_requests"`
}

// beyond returns how many publications, deliveries, promotions, claims
// and provider requests exceed the backlog.
func (f *flowCount) beyond() int64 {
	over := func(x int64) int64 { return max(0, x-f.Backlog) }
	return over(f.StreamMessages) + over(f.Deliveries) + over(f.Published) + f.Promoted + over(f.Attempts) + over(f.ProviderRequests)
}

func (f *flowCount) String() string {
	return fmt.Sprintf("%d rows: %d stream messages, %d consumer deliveries, relay published %d and promoted %d, %d claims, %d provider requests",
		f.Backlog, f.StreamMessages, f.Deliveries, f.Published, f.Promoted, f.Attempts, f.ProviderRequests)
}

// relayMetrics gives the relay started next a metrics port of its own and
// returns its /metrics URL.
func (e *env) relayMetrics() (string, error) {
	port, err := testport.Pick()
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	e.relayEnv = append(e.relayEnv, "HTTP_ADDR="+addr)
	return "http://" + addr + "/metrics", nil
}

// countFlow reads the work stream, its consumers and the relay's counters
// at metricsURL, while the processes still run.
func (e *env) countFlow(ctx context.Context, metricsURL string) (*flowCount, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	js, err := jetstream.New(e.nc)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, streams.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", streams.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", streams.Stream, err)
	}
	f := &flowCount{StreamMessages: int64(info.State.Msgs)}
	for _, l := range streams.Lanes {
		cons, err := st.Consumer(ctx, l.Consumer)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", l.Consumer, err)
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", l.Consumer, err)
		}
		f.Deliveries += int64(ci.Delivered.Consumer)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("relay metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("relay metrics: %s", resp.Status)
	}
	const published, promoted = "sendonce_relay_published_total", `sendonce_relay_timed_rows_total{what="due"}`
	v, err := metricValues(resp.Body, published, promoted)
	if err != nil {
		return nil, fmt.Errorf("relay metrics: %w", err)
	}
	f.Published, f.Promoted = int64(v[published]), int64(v[promoted])
	return f, nil
}

// metricValues returns the values of the named samples (a metric's name
// and, as exposed, its labels) of a Prometheus text exposition; a name
// missing from it is an error.
func metricValues(r io.Reader, names ...string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 || !want[line[:i]] {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("sample %s: %w", line[:i], err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("no sample %s", n)
		}
	}
	return out, nil
}

// Sides of the schedule scenario.
const (
	sideWithout = "pipeline without scheduled rows"
	sideBeside  = "pipeline beside scheduled rows"
)

// scheduleReport is the schedule scenario in bench.json.
type scheduleReport struct {
	Method string `json:"method"`
	// ScheduledRows were loaded in LoadSeconds by Load.
	ScheduledRows int     `json:"scheduled_rows"`
	LoadSeconds   float64 `json:"load_seconds"`
	Load          string  `json:"load"`
	// Backlog is each side's pending rows, drained Runs times a side.
	Backlog int `json:"backlog"`
	Runs    int `json:"runs"`
	// Without and Beside are the sides' runs and medians; Ratio is
	// Beside's median over Without's.
	Without sideSummary `json:"without"`
	Beside  sideSummary `json:"beside"`
	Ratio   float64     `json:"ratio"`
	// Untouched is the check of the scheduled rows after each side beside
	// them and after the lateness runs; Flows what each side's stream,
	// consumers and relay counted.
	Untouched   []untouchedCheck `json:"untouched"`
	FlowWithout []*flowCount     `json:"flow_without"`
	FlowBeside  []*flowCount     `json:"flow_beside"`
	// Lateness is the rows that came due under load.
	Lateness *latenessReport `json:"lateness,omitempty"`
}

// latenessReport is the rows that came due while writers committed at a
// fixed rate, beside the scheduled rows.
type latenessReport struct {
	Method string `json:"method"`
	// Rows came due over Spread, the first Lead after they were written.
	Rows   int    `json:"rows"`
	Lead   string `json:"lead"`
	Spread string `json:"spread"`
	// Rate is the writers' pace; Commits what they committed, at
	// CommitsPerSecond.
	Rate             int     `json:"writers_rate"`
	Writers          int     `json:"writers"`
	Commits          int     `json:"commits"`
	CommitsPerSecond float64 `json:"commits_per_second"`
	// ToCall is each due row's send_at to the stub's taking of its
	// request; ToSentAt to its sent_at (the sender's status write).
	ToCall   latencySummary `json:"send_at_to_call"`
	ToSentAt latencySummary `json:"send_at_to_sent_at"`
	// Early counts rows called before their send_at.
	Early int `json:"called_before_send_at"`
	// WritersToSent is the writers' rows' commit to sent (updated_at).
	WritersToSent latencySummary `json:"writers_commit_to_sent"`
	// Publications is what a subscription on sms.send saw: the writers'
	// rows and the due rows, each once.
	Publications int64 `json:"publications"`
}

// schedule runs the scenario's sides, -runs times each and interleaved,
// then the lateness, each under its own -timeout, and adds the figures. A
// side that fails is left out of its medians; its error is returned.
func (b *bench) schedule(ctx context.Context, rep *report) []error {
	c := b.cfg
	lctx, cancel := context.WithTimeout(ctx, c.timeout)
	f, err := b.setupFuture(lctx)
	cancel()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := b.dropFuture(dctx, f); err != nil {
			b.logf("[schedule] %v", err)
		}
	}()
	if err != nil {
		return []error{fmt.Errorf("schedule: %w", err)}
	}
	sr := &scheduleReport{ScheduledRows: f.rows, LoadSeconds: f.load.Seconds(), Backlog: c.pipeRows, Runs: c.runs,
		Load: "one INSERT ... SELECT generate_series: status scheduled, send_at spread over the 24 hours from a day after the load; then VACUUM (ANALYZE) and CHECKPOINT",
		Method: "each run drains the pipeline's backlog (pending rows written with COPY, 1 relay, -senders senders, the stub without latency) without, then beside, the scheduled rows, each on a fresh NATS server and stub: " +
			"without, on the bench's own tables emptied by TRUNCATE; beside, on a second copy of the product's tables in schema " + futureSchema + " of the same database, holding the scheduled rows, " +
			"from which every other row is deleted and which is vacuumed before the side; each figure is the median of its runs, the ratio beside / without of the medians"}
	results, checks, errs := b.interleave(ctx, rep, "schedule", f, [2]string{sideWithout, sideBeside}, [2]string{"without", "beside"}, true)
	if ctx.Err() != nil {
		return errs
	}
	sr.Untouched = checks
	for _, r := range results[sideBeside] {
		sr.FlowBeside = append(sr.FlowBeside, r.Flow)
	}
	for _, r := range results[sideWithout] {
		sr.FlowWithout = append(sr.FlowWithout, r.Flow)
	}
	sr.Without, sr.Beside = summarizeSide(sideWithout, results[sideWithout]), summarizeSide(sideBeside, results[sideBeside])
	sr.Ratio = ratio(sr.Beside.Rate, sr.Without.Rate)
	b.logf("[schedule] without: median %.0f msg/s of %v; beside %d scheduled rows: median %.0f msg/s of %v; %.2fx",
		sr.Without.Rate, roundAll(sr.Without.Rates), f.rows, sr.Beside.Rate, roundAll(sr.Beside.Rates), sr.Ratio)

	if ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, c.timeout)
		lr, err := b.lateness(sctx, rep, f)
		cancel()
		b.stopAll()
		if err == nil {
			var u untouchedCheck
			if u, err = b.checkUntouched(ctx, f); err == nil {
				sr.Untouched = append(sr.Untouched, u)
				b.logf("[schedule] scheduled rows after the due rows: %d of %d intact, %d changed, %d locked", u.Intact, u.Rows, u.Changed, u.Locked)
			}
		}
		if err != nil {
			b.logf("[schedule: lateness] FAILED: %v", err)
			errs = append(errs, fmt.Errorf("schedule: lateness: %w", err))
		} else {
			sr.Lateness = lr
		}
	}
	rep.addSchedule(sr, len(results[sideWithout]) > 0 && len(results[sideBeside]) > 0)
	return errs
}

// interleave drains the pipeline's backlog -runs times on each of two
// outboxes, alternating: the bench's own tables (sides[0]) and f's
// (sides[1]), each on a fresh NATS server and stub, named tag-kind-run
// in bench.json; after each side on f it checks f's loaded rows. flow
// counts what each side's stream, consumers and relay saw. A side that
// fails is left out of results; its error is returned.
func (b *bench) interleave(ctx context.Context, rep *report, tag string, f *future, sides, kinds [2]string, flow bool) (map[string][]sideResult, []untouchedCheck, []error) {
	c := b.cfg
	results := map[string][]sideResult{}
	var checks []untouchedCheck
	var errs []error
	for run := 1; run <= c.runs; run++ {
		for i, side := range sides {
			if ctx.Err() != nil {
				return results, checks, append(errs, ctx.Err())
			}
			b.logf("[%s] run %d of %d: %s", tag, run, c.runs, side)
			kind := kinds[i]
			d := pipeDrain{name: fmt.Sprintf("%s-%s-%d", tag, kind, run), scenario: tag + "-" + kind, run: run, flow: flow}
			if i == 1 {
				d.at = &f.at
			}
			sctx, cancel := context.WithTimeout(ctx, c.timeout)
			r, err := b.drainPipeline(sctx, rep, d)
			cancel()
			b.stopAll()
			if err == nil && i == 1 {
				var u untouchedCheck
				if u, err = b.checkUntouched(ctx, f); err == nil {
					checks = append(checks, u)
					b.logf("[%s] loaded rows after the side: %d of %d intact, %d changed, %d locked", tag, u.Intact, u.Rows, u.Changed, u.Locked)
				}
			}
			if err != nil {
				b.logf("[%s: %s, run %d] FAILED: %v", tag, side, run, err)
				errs = append(errs, fmt.Errorf("%s: %s, run %d: %w", tag, side, run, err))
				continue
			}
			results[side] = append(results[side], r)
		}
	}
	return results, checks, errs
}

// addSchedule adds the schedule scenario's figures: each side's median and
// Postgres's work per message, their ratio, what touched the scheduled
// rows, and the lateness; sides says both sides have runs.
func (r *report) addSchedule(s *scheduleReport, sides bool) {
	r.Schedule = s
	if sides {
		beside := fmt.Sprintf("beside %s scheduled rows", thousands(int64(s.ScheduledRows)))
		for _, side := range []struct {
			name string
			sum  sideSummary
		}{{"without scheduled rows", s.Without}, {beside, s.Beside}} {
			r.add("schedule", fmt.Sprintf("pipeline %s: drain %s pending->sent, median of %d", side.name, thousands(int64(s.Backlog)), len(side.sum.Rates)), side.sum.Rate, "msg/s")
		}
		r.addTarget("schedule", "pipeline "+beside+" / without", s.Ratio, "x", ">=", 0.95)
		r.add("schedule", "postgres CPU per message, without", s.Without.PostgresCPUMicros, "µs")
		r.add("schedule", "postgres CPU per message, "+beside, s.Beside.PostgresCPUMicros, "µs")
		r.add("schedule", "WAL bytes per message, without", s.Without.WALBytes, "B")
		r.add("schedule", "WAL bytes per message, "+beside, s.Beside.WALBytes, "B")
	}
	var touched, beyond int64
	for _, u := range s.Untouched {
		touched += u.touched()
	}
	for _, f := range s.FlowBeside {
		beyond += f.beyond()
	}
	if len(s.Untouched) > 0 {
		r.addTarget("schedule", "scheduled rows changed or locked, "+plural(len(s.Untouched), "check"), float64(touched), "rows", "<=", 0)
	}
	if len(s.FlowBeside) > 0 {
		r.addTarget("schedule", "publications, deliveries, claims and promotions beyond the backlog, "+plural(len(s.FlowBeside), "side")+" beside them", float64(beyond), "rows", "<=", 0)
	}
	if l := s.Lateness; l != nil {
		tag := fmt.Sprintf(" @%d/s, %s rows due over %s", l.Rate, thousands(int64(l.Rows)), l.Spread)
		r.add("schedule", "send_at->provider call p50"+tag, l.ToCall.P50, "ms")
		r.add("schedule", "send_at->provider call p95"+tag, l.ToCall.P95, "ms")
		r.addTarget("schedule", "send_at->provider call p99"+tag, l.ToCall.P99, "ms", "<=", 1000)
		r.add("schedule", "send_at->provider call max"+tag, l.ToCall.Max, "ms")
		r.addTarget("schedule", "provider calls before send_at", float64(l.Early), "rows", "<=", 0)
	}
}

// plural returns "1 thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

// lateness: writers commit at -rate through outbox.Enqueue beside the
// scheduled rows, with one relay and the senders running; after
// dueSettle, -due-rows rows are written in one COPY with send times
// spread evenly over -due-spread from dueLead on, and the writers go on
// until dueSettle after the last is due. Each due row's lateness is the
// stub's taking of its request (smsstub.Server.Taken) less its send_at,
// both on this host's clock.
func (b *bench) lateness(ctx context.Context, rep *report, f *future) (*latenessReport, error) {
	c := b.cfg
	const name = "schedule-due"
	e, err := b.newEnv(ctx, name, 0)
	if err != nil {
		return nil, err
	}
	defer e.close()
	e.dbURL = f.at.url
	if err := f.at.empty(ctx); err != nil {
		return nil, err
	}
	sc, err := e.subscribe(false)
	if err != nil {
		return nil, err
	}
	if _, err := e.startSenders(ctx, c.senders); err != nil {
		return nil, err
	}
	if _, err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	window := dueSettle + dueLead + c.dueSpread + dueSettle
	total := int(float64(c.rate) * window.Seconds())
	b.logf("[%s] writing %d messages at %d/s for %s with %d writers; %d rows due over %s from %s after they are written",
		name, total, c.rate, window, c.writers, c.dueRows, c.dueSpread, dueLead)
	cpu0 := b.sampleCPU()
	begin := time.Now()
	records := make([][]commitRecord, c.writers)
	var wg sync.WaitGroup
	var errOnce sync.Once
	var writeErr error
	var committed atomic.Int64
	wctx, cancelWriters := context.WithCancel(ctx)
	defer cancelWriters()
	for w := range c.writers {
		wg.Go(func() {
			if err := b.writeAtRate(wctx, f.at.pool, w, total, begin, &records[w], &committed); err != nil {
				errOnce.Do(func() { writeErr = err; cancelWriters() })
			}
		})
	}
	select {
	case <-wctx.Done():
	case <-time.After(time.Until(begin.Add(dueSettle))):
	}
	ids, sendAt, err := b.writeDue(wctx, f.at.pool, time.Now())
	if err != nil {
		errOnce.Do(func() { writeErr = err; cancelWriters() })
	}
	wg.Wait()
	if writeErr != nil {
		return nil, writeErr
	}
	writeEnd := time.Now()
	cpu := b.sampleCPU().since(cpu0)
	if err := b.waitSent(ctx, e, name, f.at.sideRows(), total+len(ids), begin, nil); err != nil {
		return nil, err
	}
	mem := b.memories()
	stats, err := e.stubStats(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkOnce(stats.Deliveries, stats.Keys, total+len(ids)); err != nil {
		return nil, err
	}
	taken, err := smsstub.FetchTaken(ctx, e.stubURL)
	if err != nil {
		return nil, err
	}
	sentAt := map[uuid.UUID]time.Time{}
	updated := make(map[uuid.UUID]time.Time, total)
	rows, _ := b.pool.Query(ctx, `SELECT id, updated_at, sent_at FROM `+f.at.sideRows()+` WHERE status = 'sent'`)
	var id uuid.UUID
	var at time.Time
	var sent *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at, &sent}, func() error {
		updated[id] = at
		if sent != nil {
			sentAt[id] = *sent
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read sent times: %w", err)
	}
	l := &latenessReport{Rows: len(ids), Lead: dueLead.String(), Spread: c.dueSpread.String(), Rate: c.rate, Writers: c.writers,
		Commits: total, CommitsPerSecond: float64(total) / writeEnd.Sub(begin).Seconds(), Publications: sc.n.Load(),
		Method: "send_at to the stub's taking of the row's request (the arrival of the provider call, smsstub /admin/taken), and to the row's sent_at (the sender's status write); both on this host's clock"}
	toCall, toSent, err := dueLateness(ids, sendAt, taken, sentAt)
	if err != nil {
		return nil, err
	}
	l.ToCall, l.ToSentAt, l.Early = summarize(toCall), summarize(toSent), summarize(toCall).Below
	var toWritten []time.Duration
	for _, rs := range records {
		for _, r := range rs {
			if s, ok := updated[r.id]; ok {
				toWritten = append(toWritten, s.Sub(r.at))
			}
		}
	}
	l.WritersToSent = summarize(toWritten)
	if l.Publications != int64(total+len(ids)) {
		return nil, fmt.Errorf("%d publications on %s for %d rows written", l.Publications, streams.SubjectSend, total+len(ids))
	}
	b.logf("[%s] %d due rows: send_at->call p50 %.1f p95 %.1f p99 %.1f max %.1f ms, %d called early; send_at->sent_at p99 %.1f ms; writers %.0f commits/s, commit->sent p99 %.1f ms",
		name, l.Rows, l.ToCall.P50, l.ToCall.P95, l.ToCall.P99, l.ToCall.Max, l.Early, l.ToSentAt.P99, l.CommitsPerSecond, l.WritersToSent.P99)
	b.logf("[%s] cpu: %s", name, cpu)
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: name, Rows: total + len(ids), CPU: cpu, Memory: mem, Details: map[string]any{"lateness": l}})
	return l, nil
}

// writeDue writes -due-rows rows in one COPY at written, with send times
// spread evenly over -due-spread from dueLead on (to the microsecond, as
// Postgres keeps them), and checks that each was written scheduled.
func (b *bench) writeDue(ctx context.Context, pool *pgxpool.Pool, written time.Time) ([]uuid.UUID, []time.Time, error) {
	c := b.cfg
	n := c.dueRows
	ids, sendAt := make([]uuid.UUID, n), make([]time.Time, n)
	for i := range n {
		ids[i] = rowID()
		sendAt[i] = written.Add(dueLead + time.Duration(float64(c.dueSpread)*float64(i)/float64(n))).Truncate(time.Microsecond)
	}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		i++
		return []any{ids[i-1], fmt.Sprintf("+1556%07d", i), fmt.Sprintf("Your sendonce bench reminder %d is now.", i), sendAt[i-1]}, nil
	})
	// The status is left to its default: the table makes a row with a
	// send time to come scheduled.
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"sms_outbox"}, []string{"id", "to_e164", "body", "send_at"}, src); err != nil {
		return nil, nil, fmt.Errorf("copy %d due rows: %w", n, err)
	}
	var scheduled int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE id = ANY($1) AND status = 'scheduled'`, ids).Scan(&scheduled); err != nil {
		return nil, nil, fmt.Errorf("check the due rows: %w", err)
	}
	if scheduled != n {
		return nil, nil, fmt.Errorf("%d of %d due rows were written scheduled", scheduled, n)
	}
	b.logf("[schedule-due] %d rows written scheduled in %s", n, since(written))
	return ids, sendAt, nil
}

// dueLateness returns each due row's time from its send_at to its call
// and to its sent_at; a row without either is an error.
func dueLateness(ids []uuid.UUID, sendAt []time.Time, taken map[string]time.Time, sentAt map[uuid.UUID]time.Time) (toCall, toSent []time.Duration, err error) {
	missing := 0
	for i, id := range ids {
		call, okC := taken[id.String()]
		sent, okS := sentAt[id]
		if !okC || !okS {
			missing++
			continue
		}
		toCall = append(toCall, call.Sub(sendAt[i]))
		toSent = append(toSent, sent.Sub(sendAt[i]))
	}
	if missing > 0 {
		return nil, nil, fmt.Errorf("%d of %d due rows have no call or no sent_at", missing, len(ids))
	}
	return toCall, toSent, nil
}
