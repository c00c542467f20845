package main

import (
	"bytes"
	"context"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/outbox"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // summarize sorts
		ds = append(ds, ms(i))
	}
	s := summarize(ds)
	if s.N != 100 || s.P50 != 50 || s.P95 != 95 || s.P99 != 99 || s.Max != 100 || s.Below != 0 {
		t.Fatalf("summarize(1..100ms) = %+v", s)
	}
	if got := percentile(nil, 99); got != 0 {
		t.Fatalf("percentile(none) = %s", got)
	}
	if got := percentile([]time.Duration{ms(7)}, 1); got != ms(7) {
		t.Fatalf("percentile(one, 1) = %s", got)
	}
	if s := summarize([]time.Duration{-ms(1), ms(2)}); s.Below != 1 {
		t.Fatalf("negative latencies not counted: %+v", s)
	}
}

func TestSteadyRate(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// 1000 rows, one per ms, from t0: 1000 rows/s throughout.
	var sent []time.Time
	for i := range 1000 {
		sent = append(sent, t0.Add(time.Duration(i)*time.Millisecond))
	}
	rate, method := steadyRate(sent, t0.Add(100*time.Millisecond), t0)
	if rate < 990 || rate > 1010 || !strings.HasPrefix(method, "steady") {
		t.Fatalf("steadyRate = %.0f (%s), want 1000 over the steady window", rate, method)
	}
	// A window too short falls back to the whole span.
	rate, method = steadyRate(sent, t0.Add(900*time.Millisecond), t0)
	if rate < 990 || rate > 1010 || strings.HasPrefix(method, "steady") {
		t.Fatalf("steadyRate = %.0f (%s), want 1000 over the whole span", rate, method)
	}
	if rate, _ := steadyRate(nil, t0, t0); rate != 0 {
		t.Fatalf("steadyRate(none) = %f", rate)
	}
}

func TestBackendDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		title, db string
		ok        bool
	}{
		{"postgres: 15/main: postgres sendonce_bench 127.0.0.1(58916) idle\x00\x00", "sendonce_bench", true},
		{"postgres: postgres other_db [local] SELECT", "other_db", true},
		{"postgres: 15/main: walwriter", "", false},
		{"postgres: 15/main: logical replication launcher", "", false},
		{"/usr/lib/postgresql/15/bin/postgres\x00-D\x00/var/lib/postgresql/15/main", "", false},
	}
	for _, tt := range tests {
		db, ok := backendDatabase(tt.title)
		if db != tt.db || ok != tt.ok {
			t.Errorf("backendDatabase(%q) = %q, %v; want %q, %v", tt.title, db, ok, tt.db, tt.ok)
		}
	}
}

func TestFigures(t *testing.T) {
	t.Parallel()
	r := &report{}
	r.addTarget("relay", "drain", 45000, "rows/s", ">=", 30000)
	r.addTarget("latency", "p99", 100, "ms", "<=", 50)
	r.addTarget("latency", "p99 zero", 0, "ms", "<=", 50)
	r.add("scaleout", "info", 612.4, "msg/s")
	if r.Figures[0].Ratio != 1.5 || !*r.Figures[0].Met {
		t.Errorf("floor: %+v", r.Figures[0])
	}
	if r.Figures[1].Ratio != 0.5 || *r.Figures[1].Met {
		t.Errorf("ceiling: %+v", r.Figures[1])
	}
	if !*r.Figures[2].Met {
		t.Errorf("a zero latency meets a ceiling: %+v", r.Figures[2])
	}
	if r.missed() != 1 {
		t.Errorf("missed = %d, want 1", r.missed())
	}
	var out bytes.Buffer
	printTable(&out, r)
	for _, want := range []string{"45,000 rows/s", ">= 30,000 rows/s", "1.50  ok", "0.50  MISSED", "612 msg/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestMemoryFigures(t *testing.T) {
	t.Parallel()
	r := &report{Scenarios: []scenarioReport{
		{Name: "relay", Memory: map[string]memory{"relay-relay": {PeakMB: 20}, "relay-nats": {PeakMB: 90}}},
		{Name: "pipeline", Memory: map[string]memory{"pipeline-relay": {PeakMB: 25}, "pipeline-sender-2": {PeakMB: 30}}},
	}}
	r.addMemoryFigures()
	if len(r.Figures) != 2 || r.Figures[0].Value != 25 || r.Figures[1].Value != 30 {
		t.Fatalf("memory figures = %+v", r.Figures)
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	env := func(string) string { return "" }
	if code := run(t.Context(), []string{"bench", "-only", "nope"}, env, io.Discard, io.Discard); code != 2 {
		t.Errorf("unknown scenario: exit %d, want 2", code)
	}
	if code := run(t.Context(), []string{"bench", "-h"}, env, io.Discard, io.Discard); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
	sel, err := parseOnly("memory")
	if err != nil || !sel["relay"] || !sel["pipeline"] || sel["latency"] {
		t.Errorf("parseOnly(memory) = %v, %v; want the relay and pipeline loads", sel, err)
	}
	var stderr bytes.Buffer
	code := run(t.Context(), []string{"bench", "-database-url", "postgres://postgres@127.0.0.1:5432/production", "-bin", t.TempDir(), "-out", ""}, env, io.Discard, &stderr)
	if code != 1 {
		t.Errorf("missing binaries: exit %d, want 1", code)
	}
}

func TestRefusesForeignDatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, bin := range []string{"relay", "sender", "smsstub", "receiver"} {
		writeExecutable(t, dir+"/"+bin)
	}
	var stderr bytes.Buffer
	code := run(t.Context(), []string{"bench", "-database-url", "postgres://postgres@127.0.0.1:5432/production", "-bin", dir, "-out", ""}, func(string) string { return "" }, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), `must be a postgres:// URL naming a database whose name contains "bench"`) {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
}

func writeExecutable(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// docs/configuration.md lists every setting, generated from bind (make docs).
func TestSettingsDoc(t *testing.T) { testkit.SettingsDoc(t, "bench", bind) }

func TestMedianAndRatio(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0}, {[]float64{7}, 7}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{5, 5, 1}, 5},
	} {
		in := append([]float64(nil), tt.xs...)
		if got := median(tt.xs); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.xs, got, tt.want)
		}
		if !slices.Equal(in, tt.xs) {
			t.Errorf("median reordered its input: %v", tt.xs)
		}
	}
	if got := ratio(3, 4); got != 0.75 {
		t.Errorf("ratio(3, 4) = %v", got)
	}
	if got := ratio(3, 0); got != 0 {
		t.Errorf("ratio(3, 0) = %v, want 0", got)
	}
}

// Each side's figure is the median of its runs, and the three targets are
// the ratios of the product's medians to the baselines'.
func TestThroughputFigures(t *testing.T) {
	t.Parallel()
	pg := func(cpu, commits, bytes, recs float64) *pgActivity {
		return &pgActivity{CPUMicrosPerMsg: cpu, CommitsPerMsg: commits, WALBytesPerMsg: bytes, WALRecordsPerMsg: recs}
	}
	res := map[string][]sideResult{
		sideBareRelay:    {{Rate: 40000, PG: pg(10, 0.002, 600, 4)}, {Rate: 36000, PG: pg(12, 0.002, 610, 4)}, {Rate: 38000, PG: pg(11, 0.002, 620, 4)}},
		sideRelay:        {{Rate: 30000, PG: pg(20, 0.01, 3000, 20)}, {Rate: 37000, PG: nil}, {Rate: 36000, PG: pg(22, 0.01, 3100, 22)}},
		sideBarePipeline: {{Rate: 6000, PG: pg(40, 0.06, 1200, 9)}, {Rate: 6400, PG: pg(42, 0.07, 1180, 9)}, {Rate: 6200, PG: pg(41, 0.065, 1190, 9)}},
		sidePipeline:     {{Rate: 5000, PG: pg(120, 0.1, 1400, 12)}, {Rate: 5100, PG: pg(130, 0.1, 1420, 12)}, {Rate: 4900, PG: pg(125, 0.1, 1410, 12)}},
		sideBareReceipts: {{Rate: 5500, PG: nil}, {Rate: 5600, PG: nil}, {Rate: 5400, PG: nil}},
		sideReceipts:     {{Rate: 5300, PG: nil}, {Rate: 5200, PG: nil}, {Rate: 5400, PG: nil}},
	}
	r := &report{}
	r.addThroughput(3, res)
	want := map[string]float64{
		"bare relay: drain pending->queued, median of 3":                           38000,
		"relay: drain pending->queued, median of 3":                                36000,
		"relay: postgres CPU per message":                                          21, // median of the two runs that have it
		"bare relay: WAL bytes per message":                                        610,
		"pipeline with receipts: drain pending->delivered (receipts), median of 3": 5300,
	}
	got := map[string]figure{}
	for _, f := range r.Figures {
		got[f.Name] = f
	}
	for name, v := range want {
		if f, ok := got[name]; !ok || f.Value != v {
			t.Errorf("%s = %+v, want %v", name, f, v)
		}
	}
	for _, tt := range []struct {
		name  string
		value float64
		met   bool
	}{
		{"relay / bare relay", 36000.0 / 38000, false},
		{"pipeline / bare pipeline", 5000.0 / 6200, false},
		{"pipeline with receipts / bare pipeline with receipts", 5300.0 / 5500, true},
	} {
		f, ok := got[tt.name]
		if !ok || f.Value != tt.value || f.Met == nil || *f.Met != tt.met || f.Unit != "x" {
			t.Errorf("%s = %+v, want %v (met %v)", tt.name, f, tt.value, tt.met)
		}
	}
	if r.Throughput == nil || r.Throughput.Runs != 3 || len(r.Throughput.Sides) != 6 || len(r.Throughput.Ratios) != 6 {
		t.Fatalf("throughput = %+v", r.Throughput)
	}
	// Postgres's work per message against the bare pipeline's, each with
	// its ceiling: CPU 125/41 > 1.5 (missed), WAL 1410/1190 > 1.1 (missed),
	// commits 0.1/0.065 > 1.5 (missed).
	for _, tt := range []struct {
		name  string
		value float64
		met   bool
	}{
		{"pipeline / bare pipeline: postgres CPU per message", 125.0 / 41, false},
		{"pipeline / bare pipeline: WAL bytes per message", 1410.0 / 1190, false},
		{"pipeline / bare pipeline: commits per message", 0.1 / 0.065, false},
	} {
		f, ok := got[tt.name]
		if !ok || f.Value != tt.value || f.Met == nil || *f.Met != tt.met || f.Op != "<=" {
			t.Errorf("%s = %+v, want %v (met %v)", tt.name, f, tt.value, tt.met)
		}
	}
	// Without the baseline, no ratio.
	r = &report{}
	r.addThroughput(1, map[string][]sideResult{sideRelay: {{Rate: 30000, PG: nil}}})
	for _, f := range r.Figures {
		if f.Op != "" {
			t.Errorf("a ratio without its baseline: %+v", f)
		}
	}
}

// The bench's own polling queries are left out of a scenario's commits.
func TestCommitsLessPolls(t *testing.T) {
	t.Parallel()
	start := pgSample{ok: true, commits: 1000, polls: 5, walBytes: 100, walRecords: 10}
	end := pgSample{ok: true, commits: 1250, polls: 55, walBytes: 20100, walRecords: 210}
	a := end.since(start, 100)
	if a.Commits != 200 || a.CommitsPerMsg != 2 || a.BenchPolls != 50 || a.WALBytesPerMsg != 200 || a.WALRecordsPerMsg != 2 {
		t.Fatalf("since = %+v", a)
	}
	if end.since(pgSample{}, 100) != nil {
		t.Fatal("since a failed sample: want nil")
	}
}

func TestWALSplit(t *testing.T) {
	rels := perMessage([]walTotal{
		{relation: "sms_outbox", records: 60_000, bytes: 19_000_000, fpi: 3_000_000},
		{relation: "sms_outbox_inflight_idx", records: 40_000, bytes: 2_700_000},
		{relation: otherRecords, records: 2_000, bytes: 60_000},
		{relation: "pg_statistic", records: 1, bytes: 8_000},
	}, 20_000)
	if got := rels[0]; got.Bytes != 950 || got.Records != 3 || got.FullPageBytes != 150 {
		t.Fatalf("sms_outbox per message = %+v, want 950 B, 3 records, 150 B of full pages", got)
	}
	const want = "sms_outbox 950, sms_outbox_inflight_idx 135, commits and other 3"
	if got := walSplit(rels); got != want {
		t.Fatalf("walSplit = %q, want %q", got, want)
	}
}

// A second bench on a database another bench is using stops at once,
// naming the reason, and the database is free again when the first ends.
func TestOneBenchADatabase(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	first := &bench{cfg: config{databaseURL: url}, dbName: "the first's"}
	if err := first.holdDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	second := &bench{cfg: config{databaseURL: url}, dbName: "the first's"}
	err := second.holdDatabase(ctx)
	if err == nil || !strings.Contains(err.Error(), "another bench is running") {
		t.Fatalf("second bench: err = %v, want another bench is running", err)
	}
	first.cleanup(false)
	if err := second.holdDatabase(ctx); err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	second.cleanup(false)
}

// parseConfig binds the flags as run does, with env as the environment.
func parseConfig(t *testing.T, args []string, env map[string]string) config {
	t.Helper()
	getenv := func(k string) string { return env[k] }
	var c config
	s := envflag.New("bench", getenv, io.Discard)
	bind(s, &c)
	if code, stop := s.Command(args); stop {
		t.Fatalf("%v: exit %d", args, code)
	}
	if c.quick {
		applyQuick(&c, s.FlagSet(), getenv)
	}
	return c
}

// -quick shrinks the schedule scenario as the others, but for what a flag
// or the environment sets.
func TestScheduleSettings(t *testing.T) {
	t.Parallel()
	c := parseConfig(t, []string{"-only", "schedule"}, nil)
	if !c.selected["schedule"] || c.selected["pipeline"] || c.scheduledRows != 1_000_000 || c.dueRows != 2000 || c.dueSpread != 10*time.Second {
		t.Errorf("defaults: %+v", c)
	}
	c = parseConfig(t, []string{"-quick"}, nil)
	if !c.selected["schedule"] || c.scheduledRows != 50_000 || c.dueRows != 200 || c.dueSpread != 2*time.Second || c.runs != 1 {
		t.Errorf("-quick: %+v", c)
	}
	c = parseConfig(t, []string{"-quick", "-due-rows", "300"}, map[string]string{"BENCH_SCHEDULED_ROWS": "70000"})
	if c.scheduledRows != 70_000 || c.dueRows != 300 || c.dueSpread != 2*time.Second {
		t.Errorf("-quick with sizes set: %+v", c)
	}
}

// The schedule scenario's figures: each side's median, the ratio and its
// target, the checks of the scheduled rows summed over the sides, and the
// lateness with its targets.
func TestScheduleFigures(t *testing.T) {
	t.Parallel()
	pg := func(cpu float64) *pgActivity { return &pgActivity{CPUMicrosPerMsg: cpu, WALBytesPerMsg: 10 * cpu} }
	flow := func(extra int64) *flowCount {
		return &flowCount{Backlog: 100, StreamMessages: 100, Deliveries: 100 + extra, Published: 100, Attempts: 100, ProviderRequests: 100}
	}
	s := &scheduleReport{ScheduledRows: 1_000_000, Backlog: 20_000, Runs: 3,
		Without:    summarizeSide(sideWithout, []sideResult{{Rate: 4000, PG: pg(120)}, {Rate: 4400, PG: pg(130)}, {Rate: 4200, PG: pg(125)}}),
		Beside:     summarizeSide(sideBeside, []sideResult{{Rate: 3900, PG: pg(140)}, {Rate: 4100, PG: pg(135)}, {Rate: 4000, PG: nil}}),
		Untouched:  []untouchedCheck{{Rows: 1_000_000, Intact: 1_000_000}, {Rows: 1_000_000, Intact: 999_997, Changed: 2, Locked: 1}},
		FlowBeside: []*flowCount{flow(0), flow(3)},
		Lateness: &latenessReport{Rows: 2000, Spread: "10s", Rate: 1000,
			ToCall: latencySummary{P50: 120, P95: 230, P99: 1200, Max: 1300}, Early: 1},
	}
	s.Ratio = ratio(s.Beside.Rate, s.Without.Rate)
	r := &report{}
	r.addSchedule(s, true)
	if r.Schedule != s {
		t.Error("the report does not hold the scenario")
	}
	got := map[string]figure{}
	for _, f := range r.Figures {
		if f.Scenario != "schedule" {
			t.Errorf("figure of scenario %q", f.Scenario)
		}
		got[f.Name] = f
	}
	for _, tt := range []struct {
		name  string
		value float64
		met   *bool
	}{
		{"pipeline without scheduled rows: drain 20,000 pending->sent, median of 3", 4200, nil},
		{"pipeline beside 1,000,000 scheduled rows: drain 20,000 pending->sent, median of 3", 4000, nil},
		{"pipeline beside 1,000,000 scheduled rows / without", 4000.0 / 4200, ptr(true)},
		{"postgres CPU per message, without", 125, nil},
		{"postgres CPU per message, beside 1,000,000 scheduled rows", 137.5, nil}, // the two runs that have it
		{"scheduled rows changed or locked, 2 checks", 3, ptr(false)},
		{"publications, deliveries, claims and promotions beyond the backlog, 2 sides beside them", 3, ptr(false)},
		{"send_at->provider call p50 @1000/s, 2,000 rows due over 10s", 120, nil},
		{"send_at->provider call p99 @1000/s, 2,000 rows due over 10s", 1200, ptr(false)},
		{"send_at->provider call max @1000/s, 2,000 rows due over 10s", 1300, nil},
		{"provider calls before send_at", 1, ptr(false)},
	} {
		f, ok := got[tt.name]
		switch {
		case !ok:
			t.Errorf("no figure %q", tt.name)
		case f.Value != tt.value:
			t.Errorf("%s = %v, want %v", tt.name, f.Value, tt.value)
		case (tt.met == nil) != (f.Met == nil) || (tt.met != nil && *tt.met != *f.Met):
			t.Errorf("%s: met %v, want %v", tt.name, f.Met, tt.met)
		}
	}
	// A ratio of 0.95 meets the target; nothing touched meets the checks.
	s.Ratio, s.Untouched, s.FlowBeside, s.Lateness = 0.95, s.Untouched[:1], s.FlowBeside[:1], nil
	r = &report{}
	r.addSchedule(s, true)
	if r.missed() != 0 {
		t.Errorf("missed %d: %+v", r.missed(), r.Figures)
	}
	for _, f := range r.Figures {
		if strings.Contains(f.Name, "1 checks") || strings.Contains(f.Name, "1 sides") {
			t.Errorf("figure %q", f.Name)
		}
	}
	// Without both sides, no ratio.
	r = &report{}
	r.addSchedule(&scheduleReport{}, false)
	if len(r.Figures) != 0 {
		t.Errorf("figures without sides: %+v", r.Figures)
	}
}

func ptr[T any](v T) *T { return &v }

func TestFlowBeyond(t *testing.T) {
	t.Parallel()
	f := &flowCount{Backlog: 20, StreamMessages: 20, Deliveries: 20, Published: 20, Attempts: 20, ProviderRequests: 20}
	if n := f.beyond(); n != 0 {
		t.Errorf("beyond = %d, want 0", n)
	}
	// Fewer than the backlog is another failure (the drain did not end),
	// not a negative excess.
	f = &flowCount{Backlog: 20, StreamMessages: 21, Deliveries: 23, Published: 19, Promoted: 4, Attempts: 20, ProviderRequests: 22}
	if n := f.beyond(); n != 1+3+4+2 {
		t.Errorf("beyond = %d, want 10", n)
	}
}

func TestMetricValues(t *testing.T) {
	t.Parallel()
	const text = `# HELP sendonce_relay_published_total Outbox row publications.
# TYPE sendonce_relay_published_total counter
sendonce_relay_published_total 20000
sendonce_relay_timed_rows_total{what="due"} 0
sendonce_relay_timed_rows_total{what="expired"} 7
sendonce_relay_batch_rows_bucket{le="+Inf"} 41
`
	v, err := metricValues(strings.NewReader(text), "sendonce_relay_published_total", `sendonce_relay_timed_rows_total{what="expired"}`)
	if err != nil || v["sendonce_relay_published_total"] != 20000 || v[`sendonce_relay_timed_rows_total{what="expired"}`] != 7 || len(v) != 2 {
		t.Fatalf("metricValues = %v, %v", v, err)
	}
	if _, err := metricValues(strings.NewReader(text), "sendonce_relay_published"); err == nil {
		t.Fatal("a missing sample: no error")
	}
}

func TestDueLateness(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	sendAt := []time.Time{t0, t0.Add(time.Second)}
	taken := map[string]time.Time{ids[0].String(): t0.Add(200 * time.Millisecond), ids[1].String(): t0.Add(999 * time.Millisecond)}
	sent := map[uuid.UUID]time.Time{ids[0]: t0.Add(210 * time.Millisecond), ids[1]: t0.Add(1010 * time.Millisecond)}
	toCall, toSent, err := dueLateness(ids, sendAt, taken, sent)
	if err != nil {
		t.Fatal(err)
	}
	if s := summarize(toCall); s.Max != 200 || s.Below != 1 {
		t.Errorf("send_at->call = %+v, want 200 ms at most and one early", s)
	}
	if s := summarize(toSent); s.Max != 210 || s.Below != 0 {
		t.Errorf("send_at->sent_at = %+v", s)
	}
	delete(taken, ids[1].String())
	if _, _, err := dueLateness(ids, sendAt, taken, sent); err == nil {
		t.Error("a row never called: no error")
	}
}

func TestWithSearchPath(t *testing.T) {
	t.Parallel()
	got, err := withSearchPath("postgres://postgres@127.0.0.1:5432/sendonce_bench?sslmode=disable", futureSchema)
	if err != nil || got != "postgres://postgres@127.0.0.1:5432/sendonce_bench?search_path=sendonce_future&sslmode=disable" {
		t.Fatalf("withSearchPath = %q, %v", got, err)
	}
}

// The check of the scheduled rows on real Postgres: a row locked or
// changed after the load is found, and emptying the outbox keeps the
// loaded rows alone.
func TestScheduledRowsChecked(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := t.Context()
	xmin, err := loadScheduled(ctx, pool, 200)
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{progress: io.Discard}
	if err := b.copyRowsIn(ctx, pool, 10, "pending", outbox.Normal); err != nil {
		t.Fatal(err)
	}
	f := &future{at: outboxAt{pool: pool, table: "sms_outbox", keepXmin: xmin}, rows: 200}
	check := func(want untouchedCheck) {
		t.Helper()
		got, err := b.checkUntouched(ctx, f)
		if err != nil || got != want {
			t.Fatalf("checkUntouched = %+v, %v; want %+v", got, err, want)
		}
	}
	check(untouchedCheck{Rows: 200, Intact: 200})
	var scheduled int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE status = 'scheduled' AND send_at > now() + interval '23 hours'`).Scan(&scheduled); err != nil || scheduled != 200 {
		t.Fatalf("%d rows scheduled for tomorrow, %v", scheduled, err)
	}
	// One claimed (locked and let go), one changed.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT id FROM sms_outbox WHERE status = 'scheduled' ORDER BY send_at LIMIT 1 FOR NO KEY UPDATE`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE sms_outbox SET updated_at = now() WHERE id = (SELECT id FROM sms_outbox WHERE status = 'scheduled' ORDER BY send_at DESC LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	check(untouchedCheck{Rows: 200, Intact: 198, Changed: 1, Locked: 1})
	if err := f.at.empty(ctx); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox`).Scan(&left); err != nil || left != 199 {
		t.Fatalf("%d rows left after empty, %v; want the 199 loaded versions", left, err)
	}
	check(untouchedCheck{Rows: 200, Intact: 198, Changed: 1, Locked: 1})
}

// The history's load on real Postgres: the mix of statuses, one attempt
// per call and a receipt per delivered or undelivered row, ids that sort
// by creation and below every id minted after the load, rows the
// product's own checks accept, and a side's rows emptied with their logs
// while the history and its logs stay.
func TestHistoryLoaded(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := t.Context()
	const n = 4000
	xmin, err := loadHistory(ctx, pool, n)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	rows, _ := pool.Query(ctx, `SELECT status, count(*) FROM sms_outbox WHERE xmin = $1::text::xid GROUP BY status`, xmin)
	var st string
	var c int
	if _, err := pgx.ForEachRow(rows, []any{&st, &c}, func() error { counts[st] = c; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"sent": 4 * historySent, "undelivered": 4 * historyUndelivered, "dead": 4 * historyDead, "unknown": 4 * historyUnknown}
	want["delivered"] = n - want["sent"] - want["undelivered"] - want["dead"] - want["unknown"]
	if !maps.Equal(counts, want) {
		t.Fatalf("statuses %v, want %v", counts, want)
	}
	var attempts, receipts, unordered, retried int
	var oldest, newest time.Time
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM sms_attempts), (SELECT count(*) FROM sms_evidence WHERE kind = 'receipt'),
		(SELECT count(*) FROM (SELECT id < lag(id) OVER (ORDER BY created_at) AS back FROM sms_outbox) AS o WHERE back),
		(SELECT count(*) FROM sms_outbox WHERE attempt_count = 2), min(created_at), max(created_at) FROM sms_outbox`).
		Scan(&attempts, &receipts, &unordered, &retried, &oldest, &newest)
	if err != nil {
		t.Fatal(err)
	}
	if retried != 4*historyRetried || attempts != n+retried || receipts != want["delivered"]+want["undelivered"] || unordered != 0 {
		t.Fatalf("%d attempts, %d retried, %d receipts, %d ids out of creation order", attempts, retried, receipts, unordered)
	}
	if age := time.Since(oldest); age > historyDays*24*time.Hour-time.Hour || age < historyDays*24*time.Hour-2*time.Hour || time.Since(newest) > time.Minute {
		t.Fatalf("rows made from %s to %s", oldest, newest)
	}
	var lastKept string
	if err := pool.QueryRow(ctx, `SELECT id::text FROM sms_outbox ORDER BY id DESC LIMIT 1`).Scan(&lastKept); err != nil {
		t.Fatal(err)
	}
	b := &bench{progress: io.Discard}
	if err := b.copyRowsIn(ctx, pool, 10, "pending", outbox.Normal); err != nil {
		t.Fatal(err)
	}
	at := outboxAt{pool: pool, table: "sms_outbox", keepXmin: xmin, keepLogs: true, lastKept: lastKept}
	var side int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+at.sideRows()+` WHERE status = 'pending'`).Scan(&side); err != nil || side != 10 {
		t.Fatalf("%d rows of the side, %v; want the 10 written after the load", side, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome) SELECT id, 1, now(), 'sent' FROM `+at.sideRows()); err != nil {
		t.Fatal(err)
	}
	if err := at.empty(ctx); err != nil {
		t.Fatal(err)
	}
	var left, leftAttempts int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM sms_outbox), (SELECT count(*) FROM sms_attempts)`).Scan(&left, &leftAttempts); err != nil || left != n || leftAttempts != attempts {
		t.Fatalf("after empty: %d rows and %d attempts, %v; want %d and %d", left, leftAttempts, err, n, attempts)
	}
	f := &future{at: at, rows: n}
	if u, err := b.checkUntouched(ctx, f); err != nil || u.Intact != n {
		t.Fatalf("checkUntouched = %+v, %v", u, err)
	}
}

// The scans on real Postgres: every step's statements come back with
// their plans through auto_explain, a read of a whole table is named, and
// the rolled-back steps leave the history as it was.
func TestScansExplainTheProductsStatements(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	ctx := t.Context()
	xmin, err := loadHistory(ctx, pool, 3000)
	if err != nil {
		t.Fatal(err)
	}
	f := &future{at: outboxAt{url: url, pool: pool, table: "sms_outbox", keepXmin: xmin, keepLogs: true}, rows: 3000}
	b := &bench{progress: io.Discard}
	cold, warm, err := b.scans(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	steps := scanSteps(uuid.Nil)
	if len(cold) != len(steps) || len(warm) != len(steps) {
		t.Fatalf("%d and %d figures for %d steps", len(cold), len(warm), len(steps))
	}
	for _, sf := range warm {
		if sf.Statements == 0 || len(sf.Plans) < sf.Statements || sf.Hit+sf.Read == 0 && sf.Name != "relay: claim of pending rows" {
			t.Errorf("%s: %d statements, %d plans, %d buffers", sf.Name, sf.Statements, len(sf.Plans), sf.Hit+sf.Read)
		}
	}
	// A statement that must read the table whole is named.
	e, err := explainOn(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer e.conn.Close(ctx)
	seq, err := e.measure(ctx, scanStep{name: "whole", run: func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT count(*) FROM sms_outbox WHERE body LIKE '%code%'`)
		return err
	}})
	if err != nil || wholeReads([]scanFigure{seq}) != 1 || seq.Statements != 1 {
		t.Fatalf("a count of the whole table: %+v, %v", seq.SeqScans, err)
	}
	var kept int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE xmin = $1::text::xid AND NOT lookup_pending`, xmin).Scan(&kept); err != nil || kept != 3000 {
		t.Fatalf("after the scans: %d rows as loaded, %v", kept, err)
	}
}

// The plans of the periodic reads and the console's pages at a realistic
// size: a million finished rows, analyzed, and no step reads a growing
// table whole or more than its bound of buffers (a small share of the
// table's pages), however the statistics came out.
func TestPeriodicReadsStayBoundedOnAMillionRows(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	ctx := t.Context()
	const n = 1_000_000
	start := time.Now()
	xmin, err := loadHistoryOf(ctx, pool, n, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) sms_outbox`); err != nil {
		t.Fatal(err)
	}
	var pages int64
	if err := pool.QueryRow(ctx, `SELECT pg_relation_size('sms_outbox') / 8192`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows loaded and analyzed in %s: %d pages", n, time.Since(start).Round(time.Millisecond), pages)
	f := &future{at: outboxAt{url: url, pool: pool, table: "sms_outbox", keepXmin: xmin}, rows: n}
	b := &bench{progress: io.Discard}
	_, warm, err := b.scans(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	for _, sf := range warm {
		// The attempts and evidence are empty here: reading them whole is
		// the plan for an empty table.
		if slices.Contains(sf.SeqScans, "sms_outbox") {
			t.Errorf("%s reads sms_outbox whole", sf.Name)
		}
		bound := pages / 100
		switch sf.Name {
		case "overdue sweep: mark":
			bound = pages / 10 // a chunk of 5,000 final rows
		case "console: overview":
			bound = pages / 4 // the last hour's rows
		case "console: dead and unknown rows":
			bound = 60_000 // the summary of 10,000 dead rows, each on a page of its own, with its attempts
		}
		t.Logf("%s: %d statements, %.1f ms, %d buffers (bound %d); read whole: %s", sf.Name, sf.Statements, sf.Millis, sf.Hit+sf.Read, bound, strings.Join(sf.SeqScans, ", "))
		if sf.Hit+sf.Read > bound {
			t.Errorf("%s read %d buffers of a %d-page table, more than %d", sf.Name, sf.Hit+sf.Read, pages, bound)
		}
	}
}
