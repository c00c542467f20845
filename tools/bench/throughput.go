package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"
)

// The throughput sides: the relay against the bare relay, the pipeline
// (and the pipeline with receipts) against the bare pipeline, run
// interleaved -runs times; each figure is the median of its runs and the
// targets are the ratios of the product's medians to the baselines'.

// Sides, in the order one run runs them.
const (
	sideBareRelay    = "bare relay"
	sideRelay        = "relay"
	sideBarePipeline = "bare pipeline"
	sidePipeline     = "pipeline"
	sideBareReceipts = "bare pipeline with receipts"
	sideReceipts     = "pipeline with receipts"
)

// sideResult is what one run of one side measured.
type sideResult struct {
	// Rate is rows/s (relay sides) or msg/s (pipeline sides).
	Rate float64
	// PG is Postgres's activity per message; nil when it could not be read.
	PG *pgActivity
	// Flow is what the stream, the consumers and the relay counted, for
	// the drains asked to count it (pipeDrain.flow); nil otherwise.
	Flow *flowCount
}

// ratioTarget is one target of the throughput: the product's side over
// its baseline, at least Min.
type ratioTarget struct {
	scenario, side, base string
	min                  float64
}

var ratioTargets = []ratioTarget{
	{"relay", sideRelay, sideBareRelay, 0.95},
	{"pipeline", sidePipeline, sideBarePipeline, 0.95},
	{"pipeline", sideReceipts, sideBareReceipts, 0.95},
}

// pgTarget is a ceiling on Postgres's work per message of a product side
// over its baseline's.
type pgTarget struct {
	side, base string
	cpu, wal   float64
	commits    float64
}

var pgTargets = []pgTarget{
	{sidePipeline, sideBarePipeline, 1.5, 1.1, 1.5},
}

// sideSummary is one side's runs and their medians, in bench.json.
type sideSummary struct {
	Side string `json:"side"`
	Unit string `json:"unit"`
	// Rates are the runs' rates in run order; Rate is their median.
	Rates []float64 `json:"rates"`
	Rate  float64   `json:"rate"`
	// The medians over the runs of Postgres's activity per message.
	PostgresCPUMicros float64 `json:"postgres_cpu_us_per_msg"`
	Commits           float64 `json:"commits_per_msg"`
	WALBytes          float64 `json:"wal_bytes_per_msg"`
	WALRecords        float64 `json:"wal_records_per_msg"`
}

// throughputReport is the throughput sides in bench.json.
type throughputReport struct {
	Runs   int           `json:"runs"`
	Method string        `json:"method"`
	Sides  []sideSummary `json:"sides"`
	// Ratios are the product's median over its baseline's median, by
	// "side / baseline".
	Ratios map[string]float64 `json:"ratios"`
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// ratio returns a/b, or 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// summarizeSide returns the medians of one side's runs.
func summarizeSide(side string, rs []sideResult) sideSummary {
	s := sideSummary{Side: side, Unit: "msg/s"}
	if side == sideRelay || side == sideBareRelay {
		s.Unit = "rows/s"
	}
	var cpu, commits, walBytes, walRecords []float64
	for _, r := range rs {
		s.Rates = append(s.Rates, r.Rate)
		if r.PG != nil {
			cpu = append(cpu, r.PG.CPUMicrosPerMsg)
			commits = append(commits, r.PG.CommitsPerMsg)
			walBytes = append(walBytes, r.PG.WALBytesPerMsg)
			walRecords = append(walRecords, r.PG.WALRecordsPerMsg)
		}
	}
	s.Rate = median(s.Rates)
	s.PostgresCPUMicros, s.Commits, s.WALBytes, s.WALRecords = median(cpu), median(commits), median(walBytes), median(walRecords)
	return s
}

// addThroughput adds each side's median figures, its Postgres work per
// message and the ratio targets to the report, for the sides that have
// runs.
func (r *report) addThroughput(runs int, results map[string][]sideResult) {
	tr := &throughputReport{Runs: runs, Ratios: map[string]float64{},
		Method: "each side's figure is the median of its runs; a run runs the sides one after the other on fresh NATS servers and stubs: bare relay, relay, bare pipeline, pipeline, bare pipeline with receipts, pipeline with receipts"}
	sums := map[string]sideSummary{}
	for _, side := range []string{sideBareRelay, sideRelay, sideBarePipeline, sidePipeline, sideBareReceipts, sideReceipts} {
		rs := results[side]
		if len(rs) == 0 {
			continue
		}
		s := summarizeSide(side, rs)
		sums[side] = s
		tr.Sides = append(tr.Sides, s)
		scen := "pipeline"
		if s.Unit == "rows/s" {
			scen = "relay"
		}
		what := "drain pending->sent"
		switch side {
		case sideBareRelay, sideRelay:
			what = "drain pending->queued"
		case sideReceipts, sideBareReceipts:
			what = "drain pending->delivered (receipts)"
		}
		r.add(scen, fmt.Sprintf("%s: %s, median of %d", side, what, len(rs)), s.Rate, s.Unit)
		r.add(scen, side+": postgres CPU per message", s.PostgresCPUMicros, "µs")
		r.add(scen, side+": commits per message", s.Commits, "commits")
		r.add(scen, side+": WAL bytes per message", s.WALBytes, "B")
		r.add(scen, side+": WAL records per message", s.WALRecords, "records")
	}
	for _, t := range ratioTargets {
		a, okA := sums[t.side]
		b, okB := sums[t.base]
		if !okA || !okB {
			continue
		}
		q := ratio(a.Rate, b.Rate)
		tr.Ratios[t.side+" / "+t.base] = q
		r.addTarget(t.scenario, t.side+" / "+t.base, q, "x", ">=", t.min)
	}
	for _, t := range pgTargets {
		a, okA := sums[t.side]
		b, okB := sums[t.base]
		if !okA || !okB {
			continue
		}
		for _, m := range []struct {
			what       string
			side, base float64
			max        float64
		}{
			{"postgres CPU per message", a.PostgresCPUMicros, b.PostgresCPUMicros, t.cpu},
			{"WAL bytes per message", a.WALBytes, b.WALBytes, t.wal},
			{"commits per message", a.Commits, b.Commits, t.commits},
		} {
			if m.side <= 0 || m.base <= 0 {
				continue // not read: no ratio rather than a made-up one
			}
			q := ratio(m.side, m.base)
			tr.Ratios[t.side+" / "+t.base+": "+m.what] = q
			r.addTarget("pipeline", t.side+" / "+t.base+": "+m.what, q, "x", "<=", m.max)
		}
	}
	r.Throughput = tr
}

// throughput runs the selected relay and pipeline sides -runs times,
// interleaved, each under its own -timeout, and adds their figures. A
// side that fails is left out of its medians; its error is returned.
func (b *bench) throughput(ctx context.Context, rep *report) []error {
	type leg struct {
		side string
		fn   func(context.Context, *report, int) (sideResult, error)
	}
	var legs []leg
	if b.cfg.selected["relay"] {
		legs = append(legs, leg{sideBareRelay, b.bareRelayDrain}, leg{sideRelay, b.relayDrain})
	}
	if b.cfg.selected["pipeline"] {
		legs = append(legs, leg{sideBarePipeline, func(ctx context.Context, rep *report, run int) (sideResult, error) {
			return b.barePipeline(ctx, rep, run, false)
		}},
			leg{sidePipeline, func(ctx context.Context, rep *report, run int) (sideResult, error) {
				return b.pipeline(ctx, rep, run, false)
			}},
			leg{sideBareReceipts, func(ctx context.Context, rep *report, run int) (sideResult, error) {
				return b.barePipeline(ctx, rep, run, true)
			}},
			leg{sideReceipts, func(ctx context.Context, rep *report, run int) (sideResult, error) {
				return b.pipeline(ctx, rep, run, true)
			}})
	}
	results := map[string][]sideResult{}
	var errs []error
	for run := 1; run <= b.cfg.runs; run++ {
		for _, l := range legs {
			if ctx.Err() != nil {
				return append(errs, ctx.Err())
			}
			b.logf("run %d of %d: %s", run, b.cfg.runs, l.side)
			sctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
			r, err := l.fn(sctx, rep, run)
			cancel()
			b.stopAll()
			if err != nil {
				b.logf("[%s, run %d] FAILED: %v", l.side, run, err)
				errs = append(errs, fmt.Errorf("%s, run %d: %w", l.side, run, err))
				continue
			}
			results[l.side] = append(results[l.side], r)
		}
	}
	rep.addThroughput(b.cfg.runs, results)
	for _, s := range rep.Throughput.Sides {
		b.logf("%s: median %.0f %s of %v; postgres %.0f µs CPU, %.2f commits, %.0f WAL bytes, %.1f WAL records per message",
			s.Side, s.Rate, s.Unit, roundAll(s.Rates), s.PostgresCPUMicros, s.Commits, s.WALBytes, s.WALRecords)
	}
	for k, v := range rep.Throughput.Ratios {
		b.logf("%s: %.2fx", k, v)
	}
	return errs
}

func roundAll(xs []float64) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x + 0.5)
	}
	return out
}

// bareRelayDrain: the bare relay's loops drain a backlog of pending rows
// in the bare table, measured as relayDrain measures the relay.
func (b *bench) bareRelayDrain(ctx context.Context, rep *report, run int) (sideResult, error) {
	n := b.cfg.relayRows
	name := fmt.Sprintf("bare-relay-%d", run)
	e, err := b.newEnv(ctx, name, -1)
	if err != nil {
		return sideResult{}, err
	}
	defer e.close()
	t := time.Now()
	if err := b.bareRows(ctx, n); err != nil {
		return sideResult{}, err
	}
	js, _, err := bareJetStream(ctx, e.nc, false)
	if err != nil {
		return sideResult{}, err
	}
	pool, err := b.barePool(ctx, bareLoops)
	if err != nil {
		return sideResult{}, err
	}
	defer pool.Close()
	b.logf("[%s] %d pending rows written with COPY in %s; starting the bare relay (%d loops)", name, n, since(t), bareLoops)
	pg0, cpu0 := b.samplePG(ctx), b.sampleCPU()
	started := time.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // before the pool closes: Close waits for its connections
	relayDone := goErr(func() error { return runBareRelay(wctx, pool, js) })
	if err := b.waitDrained(ctx, name, bareTable, "created_at", started, relayDone.failed); err != nil {
		return sideResult{}, err
	}
	done := time.Now()
	if err := relayDone.wait(); err != nil {
		return sideResult{}, err
	}
	cpu := b.sampleCPU().since(cpu0)
	mem := b.memories()
	pool.Close() // its backends publish their counters as they exit
	pg := b.finishPG(ctx, name, pg0, cpu, n)

	var queued, batches int
	var first, last time.Time
	err = b.pool.QueryRow(ctx, `SELECT count(*), min(updated_at), max(updated_at), count(DISTINCT updated_at)
		FROM `+bareTable+` WHERE status = 'queued'`).Scan(&queued, &first, &last, &batches)
	if err != nil {
		return sideResult{}, fmt.Errorf("read queued rows: %w", err)
	}
	if queued != n {
		return sideResult{}, fmt.Errorf("%d of %d rows queued", queued, n)
	}
	rate := float64(n) / done.Sub(first).Seconds()
	b.logf("[%s] %d rows queued: %.0f rows/s over %d batches", name, n, rate, batches)
	b.logf("[%s] cpu: %s", name, cpu)
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: "bare-relay", Run: run, Rows: n, CPU: cpu, Memory: mem, Postgres: pg, Details: map[string]any{
		"rows_per_second": rate, "method": drainMethod, "loops": bareLoops, "batch": bareBatch,
		"batches": batches, "mean_batch_ms": msPer(last.Sub(first), batches-1),
	}})
	return sideResult{Rate: rate, PG: pg}, nil
}

// barePipeline: the bare relay feeding the bare sender's loops (as many
// as -senders, each fetching up to -concurrency messages, so as many
// provider calls in flight as the pipeline has), against a stub without
// latency. The clock runs from the start of the relay's loops to the last
// sent row's status write, as the pipeline's does.
//
// With receipts, the stub posts each message's receipts to a bare receiver
// in the bench (bareReceiver: one UPDATE by id per settling receipt), and
// the clock runs to the last delivered row's write.
func (b *bench) barePipeline(ctx context.Context, rep *report, run int, receipts bool) (sideResult, error) {
	n := b.cfg.pipeRows
	name, scen, final := fmt.Sprintf("bare-pipeline-%d", run), "bare-pipeline", "sent"
	var stubEnv, stubArgs []string
	if receipts {
		name, scen, final = fmt.Sprintf("bare-receipts-%d", run), "bare-receipts", "delivered"
		stubEnv = []string{"SMS_WEBHOOK_SECRET=" + b.receiptSecret}
		stubArgs = []string{"-receipt-delay", "1ms"}
	}
	e, err := b.newEnvWith(ctx, name, 0, stubEnv, stubArgs...)
	if err != nil {
		return sideResult{}, err
	}
	defer e.close()
	t := time.Now()
	if err := b.bareRows(ctx, n); err != nil {
		return sideResult{}, err
	}
	js, cons, err := bareJetStream(ctx, e.nc, true)
	if err != nil {
		return sideResult{}, err
	}
	loops, batch := b.cfg.senders, b.cfg.concurrency
	conns := bareLoops + loops
	if receipts {
		conns += loops * batch // the receiver's, one a receipt in flight
	}
	pool, err := b.barePool(ctx, conns)
	if err != nil {
		return sideResult{}, err
	}
	defer pool.Close()
	client := newBareHTTPClient(loops * batch)
	defer client.CloseIdleConnections()
	s := &bareSender{pool: pool, cons: cons, client: client, stubURL: e.stubURL, apiKey: b.apiKey, batch: batch}
	if receipts {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return sideResult{}, err
		}
		srv := &http.Server{Handler: bareReceiver(pool), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		s.callback = "http://" + ln.Addr().String() + "/"
	}
	b.logf("[%s] %d pending rows written in %s; starting the bare relay and %d bare sender loops of %d", name, n, since(t), loops, batch)
	pg0, cpu0 := b.samplePG(ctx), b.sampleCPU()
	started := time.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // before the pool closes: Close waits for its connections
	relayDone := goErr(func() error { return runBareRelay(wctx, pool, js) })
	senderDone := goErr(func() error { return s.run(wctx, loops, n) })
	failed := func() error {
		if err := relayDone.failed(); err != nil {
			return fmt.Errorf("bare relay: %w", err)
		}
		return senderDone.failed()
	}
	if receipts {
		err = b.waitReceiptsIn(ctx, e, name, bareTable, n, started)
	} else {
		err = b.waitSent(ctx, e, name, bareTable, n, started, failed)
	}
	if err != nil {
		if f := failed(); f != nil {
			return sideResult{}, f
		}
		return sideResult{}, err
	}
	if err := senderDone.wait(); err != nil {
		return sideResult{}, fmt.Errorf("bare sender: %w", err)
	}
	if err := relayDone.wait(); err != nil {
		return sideResult{}, fmt.Errorf("bare relay: %w", err)
	}
	cpu := b.sampleCPU().since(cpu0)
	mem := b.memories()
	stats, err := e.stubStats(ctx)
	if err != nil {
		return sideResult{}, err
	}
	pool.Close()
	pg := b.finishPG(ctx, name, pg0, cpu, n)

	span, rate, attempts, err := b.drained(ctx, name, bareTable, final, n, started, stats, cpu)
	if err != nil {
		return sideResult{}, err
	}
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: scen, Run: run, Rows: n, CPU: cpu, Memory: mem, Postgres: pg, Details: map[string]any{
		"messages_per_second": rate, "start_to_last_sent_s": span.Seconds(), "attempts": attempts,
		"provider_requests": stats.Requests, "sender_loops": loops, "fetch_batch": batch,
	}})
	return sideResult{Rate: rate, PG: pg}, nil
}

// goroutine is a function running in a goroutine of its own.
type goroutine struct {
	done chan struct{}
	err  error
}

func goErr(fn func() error) *goroutine {
	g := &goroutine{done: make(chan struct{})}
	go func() {
		defer close(g.done)
		g.err = fn()
	}()
	return g
}

// failed returns the goroutine's error once it has ended with one.
func (g *goroutine) failed() error {
	select {
	case <-g.done:
		return g.err
	default:
		return nil
	}
}

// wait waits for the goroutine to end and returns its error.
func (g *goroutine) wait() error {
	<-g.done
	return g.err
}
