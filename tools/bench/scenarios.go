package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/outbox"
)

// relayDrain: a backlog of pending rows, written before the relay starts,
// drained to queued by one relay process (or -relays of them). The clock
// runs from the first batch's transaction start (the updated_at it gives
// its rows) to the poll of the table, every 10 ms, that finds no row
// pending: the bare relay is measured the same way, so both pay the same
// polling and neither a NATS subscription.
func (b *bench) relayDrain(ctx context.Context, rep *report, run int) (sideResult, error) {
	n := b.cfg.relayRows
	name := fmt.Sprintf("relay-%d", run)
	e, err := b.newEnv(ctx, name, -1)
	if err != nil {
		return sideResult{}, err
	}
	defer e.close()
	t := time.Now()
	if err := b.copyRows(ctx, n, "pending"); err != nil {
		return sideResult{}, err
	}
	b.logf("[%s] %d pending rows written with COPY in %s; starting %d relay(s)", name, n, since(t), b.cfg.relays)
	pg0, cpu0 := b.samplePG(ctx), b.sampleCPU()
	var started time.Time
	for i := range b.cfg.relays {
		at, err := e.startRelay(ctx)
		if err != nil {
			return sideResult{}, err
		}
		if i == 0 {
			started = at
		}
	}
	if err := b.waitDrained(ctx, name, "sms_outbox", "priority, created_at", started, nil); err != nil {
		return sideResult{}, err
	}
	done := time.Now()
	cpu := b.sampleCPU().since(cpu0)
	mem := b.memories()
	pg := b.finishPG(ctx, name, pg0, cpu, n)

	var queued, batches int
	var first, last time.Time
	err = b.pool.QueryRow(ctx, `SELECT count(*), min(updated_at), max(updated_at), count(DISTINCT updated_at)
		FROM sms_outbox WHERE status = 'queued'`).Scan(&queued, &first, &last, &batches)
	if err != nil {
		return sideResult{}, fmt.Errorf("read queued rows: %w", err)
	}
	if queued != n {
		return sideResult{}, fmt.Errorf("%d of %d rows queued", queued, n)
	}
	wall := done.Sub(started)
	rate := float64(n) / done.Sub(first).Seconds()
	b.logf("[%s] %d rows queued: %.0f rows/s over %d batches; %s from start-up to all queued", name, n, rate, batches, wall.Round(time.Millisecond))
	b.logf("[%s] cpu: %s", name, cpu)
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: "relay", Run: run, Rows: n, CPU: cpu, Memory: mem, Postgres: pg, Details: map[string]any{
		"rows_per_second": rate, "method": drainMethod, "relays": b.cfg.relays,
		"batches": batches, "mean_batch_ms": msPer(last.Sub(first), batches-1),
		"startup_to_all_queued_s": wall.Seconds(), "rows_per_second_incl_startup": float64(n) / wall.Seconds(),
	}})
	return sideResult{Rate: rate, PG: pg}, nil
}

// drainMethod says how both relays' rates are measured.
const drainMethod = "rows / (poll finding none pending, every 10 ms - first batch's transaction start)"

// waitDrained polls table every 10 ms until no row is pending, or failed
// reports an error (a bare relay's goroutines). The poll reads the table's
// pending index in its relay's claim order (order), as the relay does: a
// plain EXISTS is planned as a sequential scan (the statistics say every
// row is pending), which reads every row drained so far, every 10 ms, on
// the cores the relay needs; a 50,000-row drain spent 0.8 s of Postgres CPU
// on it.
func (b *bench) waitDrained(ctx context.Context, tag, table, order string, from time.Time, failed func() error) error {
	show := throttle(time.Second)
	return b.waitUntil(ctx, 10*time.Millisecond, func() (bool, error) {
		if failed != nil {
			if err := failed(); err != nil {
				return false, err
			}
		}
		if show() {
			b.logf("[%s] %5.1fs  draining", tag, time.Since(from).Seconds())
		}
		b.polls.Add(1)
		var one int
		err := b.pool.QueryRow(ctx, `SELECT 1 FROM `+table+` WHERE status = 'pending' ORDER BY `+order+` LIMIT 1`).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return true, nil
		}
		return false, err
	})
}

// pipeline: a backlog of pending rows sent by one relay, the senders and the
// stub without latency. The clock starts at the relay's start-up record (the
// senders are already waiting) and stops at the last status write. With
// receipts, the stub sends a signed receipt of every message 1 ms after
// accepting it to a receiver, and the clock stops at the last row the
// receiver moved to delivered.
func (b *bench) pipeline(ctx context.Context, rep *report, run int, receipts bool) (sideResult, error) {
	d := pipeDrain{name: fmt.Sprintf("pipeline-%d", run), scenario: "pipeline", run: run, receipts: receipts}
	if receipts {
		d.name, d.scenario = fmt.Sprintf("receipts-%d", run), "receipts"
	}
	return b.drainPipeline(ctx, rep, d)
}

// pipeDrain is one drain of the pipeline: the pipeline sides' and the
// schedule scenario's.
type pipeDrain struct {
	// name tags the processes and the progress lines; scenario and run
	// name the drain in bench.json.
	name, scenario string
	run            int
	// receipts drains to delivered through a receiver, not to sent.
	receipts bool
	// at is the outbox it runs on; nil: the bench database's own tables,
	// emptied first.
	at *outboxAt
	// flow counts what the stream, the consumers and the relay saw
	// (sideResult.Flow).
	flow bool
}

// drainPipeline writes -pipeline-rows pending rows and drains them with
// the relay, -senders senders and the stub, as pipeline describes.
func (b *bench) drainPipeline(ctx context.Context, rep *report, d pipeDrain) (sideResult, error) {
	n, name := b.cfg.pipeRows, d.name
	var stubEnv, stubArgs []string
	if d.receipts {
		stubEnv = []string{"SMS_WEBHOOK_SECRET=" + b.receiptSecret}
		stubArgs = []string{"-receipt-delay", "1ms"}
	}
	e, err := b.newEnvWith(ctx, name, 0, stubEnv, stubArgs...)
	if err != nil {
		return sideResult{}, err
	}
	defer e.close()
	pool, table := b.pool, "sms_outbox"
	t := time.Now()
	if d.at != nil {
		e.dbURL, pool, table = d.at.url, d.at.pool, d.at.sideRows()
		if err := d.at.empty(ctx); err != nil {
			return sideResult{}, err
		}
	}
	var metricsURL string
	if d.flow {
		if metricsURL, err = e.relayMetrics(); err != nil {
			return sideResult{}, err
		}
	}
	if err := b.copyRowsIn(ctx, pool, n, "pending", outbox.Normal); err != nil {
		return sideResult{}, err
	}
	if d.receipts {
		u, err := e.startReceiver(ctx)
		if err != nil {
			return sideResult{}, err
		}
		e.senderEnv = append(e.senderEnv, "RECEIPTS_PUBLIC_URL="+u, "RECEIPTS_ALLOW_INSECURE=true")
	}
	b.logf("[%s] %d pending rows written in %s; starting %d senders, then the relay", name, n, since(t), b.cfg.senders)
	if _, err := e.startSenders(ctx, b.cfg.senders); err != nil {
		return sideResult{}, err
	}
	pg0, cpu0 := b.samplePG(ctx), b.sampleCPU()
	started, err := e.startRelay(ctx)
	if err != nil {
		return sideResult{}, err
	}
	final := "sent"
	if d.receipts {
		final = "delivered"
		err = b.waitReceiptsIn(ctx, e, name, table, n, started)
	} else {
		err = b.waitSent(ctx, e, name, table, n, started, nil)
	}
	if err != nil {
		return sideResult{}, err
	}
	cpu := b.sampleCPU().since(cpu0)
	mem := b.memories()
	stats, err := e.stubStats(ctx)
	if err != nil {
		return sideResult{}, err
	}
	var flow *flowCount
	if d.flow {
		// Before the processes stop: the relay's counters go with it.
		if flow, err = e.countFlow(ctx, metricsURL); err != nil {
			return sideResult{}, err
		}
	}
	pg := b.finishPG(ctx, name, pg0, cpu, n)

	span, rate, attempts, err := b.drained(ctx, name, table, final, n, started, stats, cpu)
	if err != nil {
		return sideResult{}, err
	}
	details := map[string]any{
		"messages_per_second": rate, "relay_start_to_last_" + final + "_s": span.Seconds(), "attempts": attempts,
		"provider_requests": stats.Requests, "senders": b.cfg.senders, "sender_concurrency": b.cfg.concurrency,
		"receipts_sent": stats.ReceiptsSent, "receipt_failures": stats.ReceiptFailures,
	}
	if flow != nil {
		flow.Backlog, flow.Attempts, flow.ProviderRequests = int64(n), int64(attempts), stats.Requests
		details["flow"] = flow
		b.logf("[%s] %s", name, flow)
	}
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: d.scenario, Run: d.run, Rows: n, CPU: cpu, Memory: mem, Postgres: pg, Details: details})
	// Vacuum the side's dead row versions now, outside every window:
	// with autovacuum on, they would be vacuumed during the next side,
	// on another table (the sides alternate between two), and counted
	// there.
	if _, err := pool.Exec(ctx, `VACUUM sms_outbox`); err != nil {
		return sideResult{}, fmt.Errorf("vacuum after the side: %w", err)
	}
	return sideResult{Rate: rate, PG: pg, Flow: flow}, nil
}

// drained checks a drain's end: all n rows of table reached final, and
// the stub took each message once. It returns the span from started to
// the last row's update, the rate over it and the rows' attempts, and
// logs them.
func (b *bench) drained(ctx context.Context, name, table, final string, n int, started time.Time, stats smsstub.Stats, cpu cpuSplit) (time.Duration, float64, int, error) {
	var last time.Time
	var attempts, rows int
	err := b.pool.QueryRow(ctx, `SELECT count(*), max(updated_at), sum(attempt_count) FROM `+table+` WHERE status = $1`, final).Scan(&rows, &last, &attempts)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read %s rows: %w", final, err)
	}
	if rows != n {
		return 0, 0, 0, fmt.Errorf("%d of %d rows %s", rows, n, final)
	}
	if err := checkOnce(stats.Deliveries, stats.Keys, n); err != nil {
		return 0, 0, 0, err
	}
	span := last.Sub(started)
	rate := float64(n) / span.Seconds()
	b.logf("[%s] %d messages %s in %s: %.0f msg/s; %d attempts, %d provider requests, %d receipts", name, n, final, span.Round(time.Millisecond), rate, attempts, stats.Requests, stats.ReceiptsSent)
	b.logf("[%s] cpu: %s", name, cpu)
	return span, rate, attempts, nil
}

// waitSent waits until the stub has delivered n messages and table shows
// n rows sent, printing progress; failed, when not nil, ends the wait with
// its error (a bare side's goroutines).
func (b *bench) waitSent(ctx context.Context, e *env, tag, table string, n int, from time.Time, failed func() error) error {
	show := throttle(time.Second)
	return b.waitUntil(ctx, 100*time.Millisecond, func() (bool, error) {
		if failed != nil {
			if err := failed(); err != nil {
				return false, err
			}
		}
		st, err := e.stubStats(ctx)
		if err != nil {
			return false, err
		}
		if show() {
			b.logf("[%s] %5.1fs  delivered %d of %d", tag, time.Since(from).Seconds(), st.Deliveries, n)
		}
		if st.Deliveries < int64(n) {
			return false, nil
		}
		sent, err := b.countIn(ctx, table, "sent")
		return sent >= n, err
	})
}

// waitReceiptsIn waits until the stub's receipts of n messages were
// answered and n rows of table are delivered.
func (b *bench) waitReceiptsIn(ctx context.Context, e *env, tag, table string, n int, from time.Time) error {
	show := throttle(time.Second)
	return b.waitUntil(ctx, 100*time.Millisecond, func() (bool, error) {
		st, err := e.stubStats(ctx)
		if err != nil {
			return false, err
		}
		if show() {
			b.logf("[%s] %5.1fs  delivered %d of %d, %d receipts", tag, time.Since(from).Seconds(), st.Deliveries, n, st.ReceiptsSent)
		}
		if st.ReceiptsSent < int64(n) {
			return false, nil
		}
		done, err := b.countIn(ctx, table, "delivered")
		return done >= n, err
	})
}

// checkOnce fails when the stub delivered some key more than once, or not
// every one of n.
func checkOnce(deliveries, keys int64, n int) error {
	if deliveries > keys {
		return fmt.Errorf("duplicate deliveries: %d deliveries for %d keys", deliveries, keys)
	}
	if keys != int64(n) {
		return fmt.Errorf("%d keys delivered, want %d", keys, n)
	}
	return nil
}

// commitRecord is one committed insert of the latency scenario.
type commitRecord struct {
	id       uuid.UUID
	due, at  time.Time
	inWarmup bool
}

// latency: single-row transactions committed at a fixed rate by several
// writers through outbox.Enqueue, with one relay and the senders running.
// Commit time is taken when COMMIT returns; queued time is the arrival of
// the row's publication at a plain subscription on sms.send (JetStream
// stored it: the relay's PubAck comes at the same moment); sent time is the
// updated_at of the sent row (the status write's transaction start, a few
// ms before its commit). All three clocks are this host's.
func (b *bench) latency(ctx context.Context, rep *report) error {
	c := b.cfg
	l, err := b.latencyOn(ctx, rep, "latency", nil)
	if err != nil {
		return err
	}
	tag := fmt.Sprintf(" @%d/s", c.rate)
	// The writers share the cores with everything else: when they fall
	// behind, the latencies were measured at this lower rate.
	rep.add("latency", fmt.Sprintf("inserts committed (paced at %d/s)", c.rate), l.achieved, "msg/s")
	rep.add("latency", "commit->queued p50"+tag, l.queued.P50, "ms")
	rep.add("latency", "commit->queued p95"+tag, l.queued.P95, "ms")
	rep.addTarget("latency", "commit->queued p99"+tag, l.queued.P99, "ms", "<=", 50)
	rep.add("latency", "commit->sent p50"+tag, l.sent.P50, "ms")
	rep.add("latency", "commit->sent p95"+tag, l.sent.P95, "ms")
	rep.addTarget("latency", "commit->sent p99"+tag, l.sent.P99, "ms", "<=", 150)
	return nil
}

// latencyFigures is what one latency run measured.
type latencyFigures struct {
	// achieved is the writers' commits a second; queued and sent the
	// commit->queued and commit->sent latencies.
	achieved     float64
	queued, sent latencySummary
}

// latencyOn runs the latency scenario on an outbox (nil: the bench's own
// tables), named name in bench.json.
func (b *bench) latencyOn(ctx context.Context, rep *report, name string, on *outboxAt) (latencyFigures, error) {
	c := b.cfg
	var lf latencyFigures
	e, err := b.newEnv(ctx, name, 0)
	if err != nil {
		return lf, err
	}
	defer e.close()
	pool, table := b.pool, "sms_outbox"
	if on != nil {
		e.dbURL, pool, table = on.url, on.pool, on.sideRows()
		if err := on.empty(ctx); err != nil {
			return lf, err
		}
	}
	sc, err := e.subscribe(true)
	if err != nil {
		return lf, err
	}
	if _, err := e.startSenders(ctx, c.senders); err != nil {
		return lf, err
	}
	if _, err := e.startRelay(ctx); err != nil {
		return lf, err
	}
	total := int(float64(c.rate) * c.duration.Seconds())
	if total < 1 {
		return lf, errors.New("-rate times -duration is below one message")
	}
	b.logf("[%s] writing %d messages at %d/s for %s with %d writers (one row per transaction)", name, total, c.rate, c.duration, c.writers)

	pg0, cpu0 := b.samplePG(ctx), b.sampleCPU()
	begin := time.Now()
	records := make([][]commitRecord, c.writers)
	var wg sync.WaitGroup
	var errOnce sync.Once
	var writeErr error
	var committed atomic.Int64
	wctx, cancelWriters := context.WithCancel(ctx)
	defer cancelWriters()
	for w := range c.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := b.writeAtRate(wctx, pool, w, total, begin, &records[w], &committed)
			if err != nil {
				errOnce.Do(func() { writeErr = err; cancelWriters() })
			}
		}()
	}
	progressDone := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-progressDone:
				return
			case <-t.C:
				b.logf("[%s] %5.1fs  committed %d, published %d", name, time.Since(begin).Seconds(), committed.Load(), sc.n.Load())
			}
		}
	}()
	wg.Wait()
	close(progressDone)
	if writeErr != nil {
		return lf, writeErr
	}
	writeEnd := time.Now()
	cpu := b.sampleCPU().since(cpu0)
	if err := b.waitSent(ctx, e, name, table, total, begin, nil); err != nil {
		return lf, err
	}
	mem := b.memories()
	stats, err := e.stubStats(ctx)
	if err != nil {
		return lf, err
	}
	pg := b.endPG(ctx, name, pg0, total)
	if err := checkOnce(stats.Deliveries, stats.Keys, total); err != nil {
		return lf, err
	}

	sentAt := make(map[uuid.UUID]time.Time, total)
	rows, _ := b.pool.Query(ctx, `SELECT id, updated_at FROM `+table+` WHERE status = 'sent'`)
	var id uuid.UUID
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { sentAt[id] = at; return nil }); err != nil {
		return lf, fmt.Errorf("read sent times: %w", err)
	}
	_ = sc.sub.Unsubscribe() // the connection closes next anyway
	sc.mu.Lock()
	queuedAt := sc.first
	sc.mu.Unlock()

	var toQueued, toSent, lag []time.Duration
	seconds := int(c.duration/time.Second) + 1
	sentBySecond := make([][]time.Duration, seconds)
	missing := 0
	for _, rs := range records {
		for _, r := range rs {
			lag = append(lag, r.at.Sub(r.due))
			q, okQ := queuedAt[r.id]
			s, okS := sentAt[r.id]
			if !okQ || !okS {
				missing++
				continue
			}
			if sec := int(r.due.Sub(begin) / time.Second); sec < seconds {
				sentBySecond[sec] = append(sentBySecond[sec], s.Sub(r.at))
			}
			if r.inWarmup {
				continue
			}
			toQueued = append(toQueued, q.Sub(r.at))
			toSent = append(toSent, s.Sub(r.at))
		}
	}
	// The p99 of each second of writing shows a backlog building up (or a
	// slow start) where one percentile over the run cannot.
	var p99BySecond []float64
	for _, ds := range sentBySecond {
		p99BySecond = append(p99BySecond, summarize(ds).P99)
	}
	if missing > 0 {
		return lf, fmt.Errorf("%d rows have no publication or no sent time", missing)
	}
	q, s, l := summarize(toQueued), summarize(toSent), summarize(lag)
	achieved := float64(total) / writeEnd.Sub(begin).Seconds()
	b.logf("[%s] %d messages, %.0f commits/s achieved; commit->queued p50 %.1f p95 %.1f p99 %.1f ms; commit->sent p50 %.1f p95 %.1f p99 %.1f ms",
		name, total, achieved, q.P50, q.P95, q.P99, s.P50, s.P95, s.P99)
	b.logf("[%s] cpu: %s", name, cpu)
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: name, Rows: total, CPU: cpu, Memory: mem, Postgres: pg, Details: map[string]any{
		"commit_to_queued": q, "commit_to_sent": s, "commits_per_second": achieved,
		"writer_lateness": l, "writers": c.writers, "commit_to_sent_p99_ms_by_second": p99BySecond, "warmup_excluded": c.warmup.String(),
		"queued_time": "arrival of the publication at a core NATS subscription on sms.send",
		"sent_time":   "updated_at of the sent row (start of the status-write transaction)",
	}})
	lf.achieved, lf.queued, lf.sent = achieved, q, s
	return lf, nil
}

// writeAtRate commits writer w's share of total single-row transactions
// to the outbox pool's search_path finds, the i-th due at begin + i/rate,
// and records each commit.
func (b *bench) writeAtRate(ctx context.Context, pool *pgxpool.Pool, w, total int, begin time.Time, out *[]commitRecord, committed *atomic.Int64) error {
	c := b.cfg
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := w; i < total; i += c.writers {
		due := begin.Add(time.Duration(float64(i) * float64(time.Second) / float64(c.rate)))
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-timer.C:
			}
		}
		to := fmt.Sprintf("+1555%07d", i%10_000_000)
		body := fmt.Sprintf("Your sendonce bench code is %06d. It expires in 10 minutes.", i%1_000_000)
		var id uuid.UUID
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			id, err = outbox.Enqueue(ctx, tx, to, body)
			return err
		})
		if err != nil {
			return fmt.Errorf("writer %d: %w", w, err)
		}
		*out = append(*out, commitRecord{id: id, due: due, at: time.Now(), inWarmup: due.Sub(begin) < c.warmup})
		committed.Add(1)
	}
	return nil
}

// scaleOut: a backlog already queued in JetStream, sent by one sender and
// then, on fresh parts, by scaleSenders senders, against the stub with
// latency. Throughput is counted in the steady window: from 200 ms after the
// last sender started to the time 95 % of the rows were sent, so start-up
// and the tail do not count.
func (b *bench) scaleOut(ctx context.Context, rep *report) error {
	one, err := b.scaleLeg(ctx, rep, 1)
	if err != nil {
		return err
	}
	many, err := b.scaleLeg(ctx, rep, b.cfg.scaleSenders)
	if err != nil {
		return err
	}
	ratio := many / one
	b.logf("[scaleout] %d senders: %.2fx one sender", b.cfg.scaleSenders, ratio)
	lat := fmt.Sprintf("stub %s", b.cfg.scaleLatency)
	rep.add("scaleout", fmt.Sprintf("1 sender, %s", lat), one, "msg/s")
	rep.add("scaleout", fmt.Sprintf("%d senders, %s", b.cfg.scaleSenders, lat), many, "msg/s")
	rep.addTarget("scaleout", fmt.Sprintf("%d senders vs 1", b.cfg.scaleSenders), ratio, "x", ">=", 3.5)
	return nil
}

func (b *bench) scaleLeg(ctx context.Context, rep *report, senders int) (float64, error) {
	name := fmt.Sprintf("scaleout-%d", senders)
	tag := "[" + name + "]"
	n := b.cfg.scaleRows * senders
	e, err := b.newEnv(ctx, name, b.cfg.scaleLatency)
	if err != nil {
		return 0, err
	}
	defer e.close()
	if err := b.copyRows(ctx, n, "pending"); err != nil {
		return 0, err
	}
	sc, err := e.subscribe(false)
	if err != nil {
		return 0, err
	}
	if _, err := e.startRelay(ctx); err != nil {
		return 0, err
	}
	err = b.waitUntil(ctx, 50*time.Millisecond, func() (bool, error) {
		if sc.n.Load() < int64(n) {
			return false, nil
		}
		pending, err := b.countStatus(ctx, "pending")
		return pending == 0, err
	})
	if err != nil {
		return 0, fmt.Errorf("queue the backlog: %w", err)
	}
	b.logf("%s %d rows queued in JetStream; starting %d senders (concurrency %d, stub latency %s)", tag, n, senders, b.cfg.concurrency, b.cfg.scaleLatency)
	pg0, cpu0 := b.samplePG(ctx), b.sampleCPU()
	lastStarted, err := e.startSenders(ctx, senders)
	if err != nil {
		return 0, err
	}
	if err := b.waitSent(ctx, e, name, "sms_outbox", n, lastStarted, nil); err != nil {
		return 0, err
	}
	cpu := b.sampleCPU().since(cpu0)
	mem := b.memories()
	stats, err := e.stubStats(ctx)
	if err != nil {
		return 0, err
	}
	pg := b.endPG(ctx, name, pg0, n)
	if err := checkOnce(stats.Deliveries, stats.Keys, n); err != nil {
		return 0, err
	}

	var sent []time.Time
	rows, _ := b.pool.Query(ctx, `SELECT updated_at FROM sms_outbox WHERE status = 'sent' ORDER BY updated_at`)
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&at}, func() error { sent = append(sent, at); return nil }); err != nil {
		return 0, fmt.Errorf("read sent times: %w", err)
	}
	// The first call started about one stub latency before the first
	// acceptance was written (the attempts log keeps no first attempt that
	// was sent).
	var firstSent time.Time
	if err := b.pool.QueryRow(ctx, `SELECT min(sent_at) FROM sms_outbox`).Scan(&firstSent); err != nil {
		return 0, fmt.Errorf("read first acceptance: %w", err)
	}
	firstAttempt := firstSent.Add(-b.cfg.scaleLatency)
	rate, method := steadyRate(sent, lastStarted.Add(200*time.Millisecond), firstAttempt)
	ideal := float64(senders*b.cfg.concurrency) / b.cfg.scaleLatency.Seconds()
	b.logf("%s %.0f msg/s (%s); the stub latency allows %.0f", tag, rate, method, ideal)
	b.logf("%s cpu: %s", tag, cpu)
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: name, Rows: n, CPU: cpu, Memory: mem, Postgres: pg, Details: map[string]any{
		"messages_per_second": rate, "method": method, "senders": senders, "sender_concurrency": b.cfg.concurrency,
		"stub_latency": b.cfg.scaleLatency.String(), "latency_bound_messages_per_second": ideal,
		"provider_requests": stats.Requests,
	}})
	return rate, nil
}

// steadyRate returns the rate of the sorted send times between from and the
// time 95 % of them were sent; when that window is too short it falls back
// to all rows over the whole span since first.
func steadyRate(sorted []time.Time, from, first time.Time) (float64, string) {
	if len(sorted) == 0 {
		return 0, "no rows"
	}
	to := sorted[min(len(sorted)-1, len(sorted)*95/100)]
	if to.Sub(from) >= 500*time.Millisecond {
		lo, _ := slices.BinarySearchFunc(sorted, from, func(t, x time.Time) int { return t.Compare(x) })
		hi, _ := slices.BinarySearchFunc(sorted, to, func(t, x time.Time) int { return t.Compare(x) })
		if hi > lo {
			return float64(hi-lo) / to.Sub(from).Seconds(), "steady window: 200ms after the last sender started to 95% sent"
		}
	}
	span := sorted[len(sorted)-1].Sub(first)
	if span <= 0 {
		return 0, "no span"
	}
	return float64(len(sorted)) / span.Seconds(), "all rows from the first attempt to the last status write"
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

func msPer(d time.Duration, n int) float64 {
	if n <= 0 {
		return 0
	}
	return float64(d) / float64(time.Millisecond) / float64(n)
}
