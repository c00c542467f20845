package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/pgtest"
	"github.com/sendonce/sendonce/internal/testkit"
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
		sideBareRelay:    {{40000, pg(10, 0.002, 600, 4)}, {36000, pg(12, 0.002, 610, 4)}, {38000, pg(11, 0.002, 620, 4)}},
		sideRelay:        {{30000, pg(20, 0.01, 3000, 20)}, {37000, nil}, {36000, pg(22, 0.01, 3100, 22)}},
		sideBarePipeline: {{6000, pg(40, 0.06, 1200, 9)}, {6400, pg(42, 0.07, 1180, 9)}, {6200, pg(41, 0.065, 1190, 9)}},
		sidePipeline:     {{5000, pg(120, 0.1, 1400, 12)}, {5100, pg(130, 0.1, 1420, 12)}, {4900, pg(125, 0.1, 1410, 12)}},
		sideBareReceipts: {{5500, nil}, {5600, nil}, {5400, nil}},
		sideReceipts:     {{4400, nil}, {4300, nil}, {4500, nil}},
	}
	r := &report{}
	r.addThroughput(3, res)
	want := map[string]float64{
		"bare relay: drain pending->queued, median of 3":                           38000,
		"relay: drain pending->queued, median of 3":                                36000,
		"relay: postgres CPU per message":                                          21, // median of the two runs that have it
		"bare relay: WAL bytes per message":                                        610,
		"pipeline with receipts: drain pending->delivered (receipts), median of 3": 4400,
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
		{"pipeline / bare pipeline", 5000.0 / 6200, true},
		{"pipeline with receipts / bare pipeline with receipts", 4400.0 / 5500, true},
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
	// its ceiling: CPU 125/41 > 2 (missed), WAL 1410/1190 > 1.15 (missed),
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
	r.addThroughput(1, map[string][]sideResult{sideRelay: {{30000, nil}}})
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
