// Command bench measures sendonce on real parts and compares each figure
// with its target: a local Postgres database of its own, an embedded NATS
// server with JetStream (or NATS_URL), the provider stub, and the relay and
// sender binaries run as separate processes, as in production.
//
//	bench [flags]              run the scenarios, print one table, write bench.json
//	bench -only relay,latency  run some of them
//	bench -quick               a small version for CI (seconds, not minutes)
//
// Scenarios:
//
//	relay     a backlog of pending rows (written with COPY before the relay
//	          starts) drained to queued by one relay, and by the bare
//	          relay: rows/s and their ratio
//	pipeline  a backlog drained from pending to sent by 1 relay, 2 senders
//	          and the stub without latency; the same with receipts (to
//	          delivered, through a receiver); and by the bare pipeline,
//	          without and with receipts (one UPDATE by id a receipt):
//	          msg/s and the ratios, and Postgres's CPU, WAL bytes and
//	          commits per message against the bare pipeline's
//	schedule  the pipeline's backlog drained beside -scheduled-rows
//	          (1,000,000) rows scheduled for tomorrow (loaded once, in a
//	          second copy of the product's tables in the bench database)
//	          and without them, interleaved: msg/s
//	          both ways and their ratio, Postgres's work per message, and
//	          that no scheduled row was claimed, published or changed;
//	          then rows that come due while writers commit at -rate
//	          beside them: send_at to the provider's call p50/p95/p99/max
//	          and the calls made early
//	history   the pipeline's backlog drained beside -history-rows
//	          (10,000,000) finished rows of a week, with their attempts
//	          and receipts (loaded once, in a copy of the product's tables
//	          of its own), and on an empty table, interleaved: msg/s, and
//	          Postgres's CPU and WAL per message, both ways and their
//	          ratios, and that no finished row was changed
//	backlog   -backlog-rows (1,000,000) pending rows written before the
//	          senders and the relay start, drained while urgent rows are
//	          enqueued at 10/s, against -backlog-small (10,000): the drain
//	          rates and their ratio, the urgent rows' commit->sent, the
//	          redeliveries, and each process's peak RSS
//	latency   committed single-row inserts at a fixed rate (outbox.Enqueue,
//	          8 writers): commit->queued and commit->sent p50/p95/p99
//	scaleout  a queued backlog sent by 1 sender, then by 4, against the stub
//	          with 50 ms latency: the throughput ratio
//	memory    the relay's and senders' peak RSS (VmHWM) under those loads
//
// The bare relay and the bare pipeline are baselines run in goroutines of
// the bench, on the same Postgres and NATS server, with a table of their
// own (schema sendonce_bare, only a partial index on the pending rows) and
// a stream of their own (BARE): the floor of the work, with no leases,
// fences, attempts log, receipts or metrics. The relay and pipeline sides
// run -runs times, interleaved (bare relay, relay, bare pipeline, pipeline,
// bare pipeline with receipts, pipeline with receipts); each figure is the
// median of its runs, and the
// targets are the product's medians over the baselines'. Every side also
// reports Postgres's CPU, commits and WAL per message.
//
// The embedded NATS server runs in a child process (this binary, re-executed
// as "bench nats-server"), so that its CPU time is counted apart from the
// bench's own work (writers, subscription, polling). Every scenario gets a
// fresh server and store, a fresh stub, fresh relay and sender processes and
// an emptied outbox table. Settings of the relay and sender found in the
// environment (RELAY_BATCH_SIZE, SENDER_CONCURRENCY, ...) reach the
// processes, so a tuning can be measured without a rebuild; the bench sets
// only what it must (DATABASE_URL, NATS_URL, HTTP_ADDR, SMS_API_*, and
// SENDER_CONCURRENCY from -concurrency).
//
// Progress goes to stderr; the table to stdout. The process exits 1 when a
// scenario could not run or a message was delivered twice, and with -strict
// also when a figure misses its target.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/proc"
)

func main() { proc.Main(run) }

// scenarioNames lists the scenarios in the order they run.
var scenarioNames = []string{"relay", "pipeline", "schedule", "history", "backlog", "latency", "scaleout", "priority", "ratelimit", "memory"}

type config struct {
	databaseURL  string
	natsURL      string
	binDir       string
	out          string
	only         string
	quick        bool
	strict       bool
	keepLogs     bool
	runs         int
	relayRows    int
	relays       int
	pipeRows     int
	senders      int
	concurrency  int
	rate         int
	writers      int
	duration     time.Duration
	warmup       time.Duration
	scaleRows    int
	scaleSenders int
	scaleLatency time.Duration
	timeout      time.Duration
	bulkRows     int
	urgentRows   int
	limitWindow  time.Duration
	// The schedule scenario's rows scheduled for tomorrow, and its rows
	// that come due over dueSpread.
	scheduledRows int
	dueRows       int
	dueSpread     time.Duration
	// The history scenario's finished rows, and how long their load may
	// take.
	historyRows    int
	historyTimeout time.Duration
	// The backlog scenario's two backlogs, and how long its drains may
	// take.
	backlogRows, backlogSmall int
	backlogTimeout            time.Duration

	selected map[string]bool
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 1 && args[1] == "nats-server" {
		return runNATSServer(ctx, args[2:], stdout, stderr)
	}
	var c config
	s := envflag.New("bench", getenv, stderr)
	bind(s, &c)
	if code, stop := s.Command(args[1:]); stop {
		return code
	}
	if c.quick {
		applyQuick(&c, s.FlagSet(), getenv)
	}
	b := &bench{cfg: c, progress: stderr}
	rep, err := b.run(ctx)
	b.cleanup(err != nil)
	if rep != nil {
		printTable(stdout, rep)
		if c.out != "" {
			if werr := writeJSON(c.out, rep); werr != nil {
				fmt.Fprintf(stderr, "bench: %v\n", werr)
				err = errors.Join(err, werr)
			} else {
				fmt.Fprintf(stderr, "bench: results written to %s\n", c.out)
			}
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		if b.logDir != "" {
			fmt.Fprintf(stderr, "bench: process logs are in %s\n", b.logDir)
		}
		return 1
	}
	if c.strict && rep != nil && rep.missed() > 0 {
		fmt.Fprintf(stderr, "bench: %d figures missed their target\n", rep.missed())
		return 1
	}
	return 0
}

func bind(s *envflag.Set, c *config) {
	s.String(&c.databaseURL, "database-url", "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/sendonce_bench?sslmode=disable",
		"Postgres database of the bench, created if missing; its name must contain \"bench\" (its tables are emptied)")
	s.String(&c.natsURL, "nats-url", "NATS_URL", "", "NATS server to use instead of a fresh embedded one per scenario; its SMS and SMS_DLQ streams are deleted before each scenario")
	s.String(&c.binDir, "bin", "BENCH_BIN", "bin", "directory holding the relay, sender and smsstub binaries")
	s.String(&c.out, "out", "BENCH_OUT", "bench.json", "file the results are written to as JSON; empty writes none")
	s.String(&c.only, "only", "BENCH_ONLY", "", "comma-separated scenarios to run ("+strings.Join(scenarioNames, ", ")+"); empty runs all")
	s.Bool(&c.quick, "quick", "BENCH_QUICK", false, "a small version of every scenario (for CI): sizes and durations divided by about 10 unless set explicitly")
	s.Bool(&c.strict, "strict", "BENCH_STRICT", false, "exit 1 when a figure misses its target")
	s.Bool(&c.keepLogs, "keep-logs", "BENCH_KEEP_LOGS", false, "keep the processes' log directory")
	s.Int(&c.runs, "runs", "BENCH_RUNS", 3, 1, 99, "relay, pipeline, schedule and history: interleaved runs of every side (bare relay, relay, bare pipeline, pipeline, bare pipeline with receipts, pipeline with receipts; schedule: without, then beside the scheduled rows; history: on an empty table, then beside the history); each figure is the median of its runs")
	s.Int(&c.relayRows, "rows", "BENCH_ROWS", 50_000, 1, 10_000_000, "relay: pending rows to drain")
	s.Int(&c.relays, "relays", "BENCH_RELAYS", 1, 1, 16, "relay: relay processes sharing the backlog")
	s.Int(&c.pipeRows, "pipeline-rows", "BENCH_PIPELINE_ROWS", 20_000, 1, 10_000_000, "pipeline, schedule and history: pending rows to send")
	s.Int(&c.senders, "senders", "BENCH_SENDERS", 2, 1, 32, "pipeline, schedule, history, backlog and latency: sender processes")
	s.Int(&c.concurrency, "concurrency", "SENDER_CONCURRENCY", 32, 1, 10000, "provider calls in flight per sender")
	s.Int(&c.rate, "rate", "BENCH_RATE", 1000, 1, 100_000, "latency, schedule (while rows come due) and history: committed inserts per second")
	s.Int(&c.writers, "writers", "BENCH_WRITERS", 8, 1, 256, "latency, schedule and history: writer goroutines, one single-row transaction at a time each")
	s.Duration(&c.duration, "duration", "BENCH_DURATION", 15*time.Second, 100*time.Millisecond, time.Hour, "latency and history: how long to write")
	s.Duration(&c.warmup, "warmup", "BENCH_WARMUP", time.Second, 0, time.Hour, "latency: rows committed this early are left out of the percentiles")
	s.Int(&c.scaleRows, "scale-rows", "BENCH_SCALE_ROWS", 4000, 1, 10_000_000, "scaleout: queued rows per sender process")
	s.Int(&c.scaleSenders, "scale-senders", "BENCH_SCALE_SENDERS", 4, 2, 32, "scaleout: sender processes compared with one")
	s.Duration(&c.scaleLatency, "scale-latency", "BENCH_SCALE_LATENCY", 50*time.Millisecond, 0, time.Minute, "scaleout: provider stub latency")
	s.Int(&c.bulkRows, "bulk-rows", "BENCH_BULK_ROWS", 50_000, 1, 10_000_000, "priority: bulk rows queued before the urgent ones")
	s.Int(&c.urgentRows, "urgent-rows", "BENCH_URGENT_ROWS", 100, 1, 100_000, "priority: urgent rows enqueued at 10/s behind the bulk backlog")
	s.Duration(&c.limitWindow, "ratelimit-duration", "BENCH_RATELIMIT_DURATION", 60*time.Second, time.Second, time.Hour, "ratelimit: how long the backlog lasts at the limit (200/s)")
	s.Int(&c.scheduledRows, "scheduled-rows", "BENCH_SCHEDULED_ROWS", 1_000_000, 1, 100_000_000, "schedule: rows scheduled for tomorrow (loaded once, into an outbox of their own) beside which the pipeline's backlog is drained, against the same backlog without them")
	s.Int(&c.dueRows, "due-rows", "BENCH_DUE_ROWS", 2000, 1, 1_000_000, "schedule: rows written with a send time 3 s to 3 s + -due-spread ahead while writers commit at -rate beside the scheduled rows: how late after its send time each one is called")
	s.Duration(&c.dueSpread, "due-spread", "BENCH_DUE_SPREAD", 10*time.Second, 0, time.Hour, "schedule: the due rows' send times are spread evenly over this")
	s.Int(&c.historyRows, "history-rows", "BENCH_HISTORY_ROWS", 10_000_000, 1, 1_000_000_000, "history: finished rows (a week of them, with their attempts and receipts; loaded once, into an outbox of their own) beside which the pipeline's backlog is drained, against the same backlog on an empty table")
	s.Duration(&c.historyTimeout, "history-load-timeout", "BENCH_HISTORY_LOAD_TIMEOUT", time.Hour, time.Second, 24*time.Hour, "history: give up on loading the finished rows after this")
	s.Int(&c.backlogRows, "backlog-rows", "BENCH_BACKLOG_ROWS", 1_000_000, 1, 100_000_000, "backlog: pending rows when the senders and the relay start (an outage's backlog), drained while urgent rows are enqueued at 10/s")
	s.Int(&c.backlogSmall, "backlog-small", "BENCH_BACKLOG_SMALL", 10_000, 1, 100_000_000, "backlog: the small backlog whose drain rate -backlog-rows' is compared with")
	s.Duration(&c.backlogTimeout, "backlog-timeout", "BENCH_BACKLOG_TIMEOUT", 30*time.Minute, time.Second, 24*time.Hour, "backlog: give up on a drain that has not finished by then")
	s.Duration(&c.timeout, "timeout", "BENCH_TIMEOUT", 3*time.Minute, time.Second, 24*time.Hour, "give up on a scenario that has not finished by then")
	s.Check(func() error {
		sel, err := parseOnly(c.only)
		c.selected = sel
		return err
	})
}

// parseOnly turns the -only list into a set; empty selects every scenario.
// Memory alone selects the relay and pipeline loads to measure it under.
func parseOnly(only string) (map[string]bool, error) {
	sel := map[string]bool{}
	for _, f := range strings.Split(only, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(scenarioNames, f) {
			return nil, fmt.Errorf("-only / BENCH_ONLY: unknown scenario %q (want %s)", f, strings.Join(scenarioNames, ", "))
		}
		sel[f] = true
	}
	if len(sel) == 0 {
		for _, n := range scenarioNames {
			sel[n] = true
		}
	}
	if len(sel) == 1 && sel["memory"] {
		sel["relay"], sel["pipeline"] = true, true
	}
	return sel, nil
}

// applyQuick shrinks every size and duration not set by a flag or its
// environment variable.
func applyQuick(c *config, fs *flag.FlagSet, getenv func(string) string) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	shrink := func(name, env string, apply func()) {
		if !set[name] && getenv(env) == "" {
			apply()
		}
	}
	shrink("runs", "BENCH_RUNS", func() { c.runs = 1 })
	shrink("rows", "BENCH_ROWS", func() { c.relayRows = 5000 })
	shrink("pipeline-rows", "BENCH_PIPELINE_ROWS", func() { c.pipeRows = 2000 })
	shrink("duration", "BENCH_DURATION", func() { c.duration = 3 * time.Second })
	shrink("warmup", "BENCH_WARMUP", func() { c.warmup = 500 * time.Millisecond })
	shrink("scale-rows", "BENCH_SCALE_ROWS", func() { c.scaleRows = 600 })
	shrink("bulk-rows", "BENCH_BULK_ROWS", func() { c.bulkRows = 5000 })
	shrink("urgent-rows", "BENCH_URGENT_ROWS", func() { c.urgentRows = 20 })
	shrink("ratelimit-duration", "BENCH_RATELIMIT_DURATION", func() { c.limitWindow = 25 * time.Second })
	shrink("scheduled-rows", "BENCH_SCHEDULED_ROWS", func() { c.scheduledRows = 50_000 })
	shrink("history-rows", "BENCH_HISTORY_ROWS", func() { c.historyRows = 100_000 })
	shrink("backlog-rows", "BENCH_BACKLOG_ROWS", func() { c.backlogRows = 20_000 })
	shrink("backlog-small", "BENCH_BACKLOG_SMALL", func() { c.backlogSmall = 2_000 })
	shrink("due-rows", "BENCH_DUE_ROWS", func() { c.dueRows = 200 })
	shrink("due-spread", "BENCH_DUE_SPREAD", func() { c.dueSpread = 2 * time.Second })
	shrink("timeout", "BENCH_TIMEOUT", func() { c.timeout = time.Minute })
}
