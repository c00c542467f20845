package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// report is everything a run measured; it is written to bench.json.
type report struct {
	// Started and Finished bound the run, in UTC.
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Host describes the machine: CPUs, model, Go version, and how busy it
	// was before the bench started.
	Host map[string]any `json:"host"`
	// Config is the sizes and settings the run used.
	Config map[string]any `json:"config"`
	// Figures are the rows of the table, in order.
	Figures []figure `json:"figures"`
	// Scenarios hold what each scenario measured besides its figures.
	Scenarios []scenarioReport `json:"scenarios"`
	// Throughput is each relay and pipeline side's runs and medians, and
	// the ratios of the product to the bare baselines.
	Throughput *throughputReport `json:"throughput,omitempty"`
	// Schedule is the schedule scenario: its sides' runs and medians, the
	// checks of the scheduled rows and the lateness of the due ones.
	Schedule *scheduleReport `json:"schedule,omitempty"`
	History  *historyReport  `json:"history,omitempty"`
	Backlog  *backlogReport  `json:"backlog,omitempty"`
}

// figure is one row of the table.
type figure struct {
	// Scenario and Name say what was measured.
	Scenario string `json:"scenario"`
	Name     string `json:"figure"`
	// Value is the measurement, in Unit (rows/s, msg/s, ms, x, MB).
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Op is ">=" or "<=" when the figure has a target, empty otherwise;
	// Target is the bound, in Unit.
	Op     string  `json:"op,omitempty"`
	Target float64 `json:"target,omitempty"`
	// Ratio says how far past the target the value is: value/target for
	// ">=", target/value for "<="; 1 or more meets the target.
	Ratio float64 `json:"ratio,omitempty"`
	// Met says whether the target is met; nil without a target.
	Met *bool `json:"met,omitempty"`
}

// scenarioReport is what one scenario (or one leg of the scale-out) saw.
type scenarioReport struct {
	// Name is the scenario (scaleout-N for a leg of the scale-out).
	Name string `json:"name"`
	// Run is the run of the relay and pipeline sides (1..-runs).
	Run int `json:"run,omitempty"`
	// Rows is how many messages it moved.
	Rows int `json:"rows"`
	// CPU is the CPU used over the measured window, by process group.
	CPU cpuSplit `json:"cpu"`
	// Memory is every process's resident set at the end of the scenario.
	Memory map[string]memory `json:"memory"`
	// Postgres is what the database did over the scenario.
	Postgres *pgActivity `json:"postgres,omitempty"`
	// Details are the scenario's own measurements.
	Details map[string]any `json:"details"`
}

func (r *report) add(scenario, name string, value float64, unit string) {
	r.Figures = append(r.Figures, figure{Scenario: scenario, Name: name, Value: value, Unit: unit})
}

// addTarget adds a figure with a target; op is ">=" or "<=".
func (r *report) addTarget(scenario, name string, value float64, unit, op string, target float64) {
	f := figure{Scenario: scenario, Name: name, Value: value, Unit: unit, Op: op, Target: target}
	switch {
	case op == ">=" && target > 0:
		f.Ratio = value / target
	case op == "<=" && value > 0:
		f.Ratio = target / value
	case op == "<=":
		f.Ratio = math.Inf(1)
	}
	met := f.Ratio >= 1
	f.Met = &met
	if math.IsInf(f.Ratio, 0) || math.IsNaN(f.Ratio) {
		f.Ratio = 0 // JSON has no infinity; Met says it all
	}
	r.Figures = append(r.Figures, f)
}

func (r *report) missed() int {
	n := 0
	for _, f := range r.Figures {
		if f.Met != nil && !*f.Met {
			n++
		}
	}
	return n
}

// addMemoryFigures adds the largest peak RSS of any relay and of any sender
// over the scenarios that ran.
func (r *report) addMemoryFigures() {
	for _, role := range []string{"relay", "sender"} {
		best, where := 0.0, ""
		for _, s := range r.Scenarios {
			for name, m := range s.Memory {
				if procRole(name) == role && m.PeakMB > best {
					best, where = m.PeakMB, name
				}
			}
		}
		if where == "" {
			continue
		}
		r.addTarget("memory", fmt.Sprintf("%s peak RSS (VmHWM, max in %s)", role, where), best, "MB", "<=", 100)
	}
}

// procRole returns "relay" or "sender" for a process named
// "<scenario>-relay" or "<scenario>-sender-N", else "".
func procRole(name string) string {
	switch {
	case strings.HasSuffix(name, "-relay"):
		return "relay"
	case strings.Contains(name, "-sender-"):
		return "sender"
	}
	return ""
}

// printTable writes the figures as one aligned table.
func printTable(w io.Writer, r *report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tfigure\tvalue\ttarget\tratio\t")
	for _, f := range r.Figures {
		target, ratio := "-", "-"
		if f.Op != "" {
			target = f.Op + " " + formatValue(f.Target, f.Unit)
			ratio = strconv.FormatFloat(f.Ratio, 'f', 2, 64)
			if *f.Met {
				ratio += "  ok"
			} else {
				ratio += "  MISSED"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", f.Scenario, f.Name, formatValue(f.Value, f.Unit), target, ratio)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "ratio: value/target for a floor, target/value for a ceiling; 1.00 or more meets the target")
}

// formatValue prints a value with its unit: rates with thousands
// separators, times and sizes with one decimal.
func formatValue(v float64, unit string) string {
	switch unit {
	case "rows/s", "msg/s", "rows":
		return thousands(int64(math.Round(v))) + " " + unit
	case "x":
		return strconv.FormatFloat(v, 'f', 2, 64) + "x"
	case "commits":
		return strconv.FormatFloat(v, 'f', 3, 64) + " " + unit
	case "B":
		return thousands(int64(math.Round(v))) + " " + unit
	default:
		return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit
	}
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// writeJSON writes the report to path.
func writeJSON(path string, r *report) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func hostInfo() map[string]any {
	h := map[string]any{"cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS, "arch": runtime.GOARCH}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				h["cpu_model"] = strings.TrimSpace(v)
				break
			}
		}
	}
	return h
}

func configJSON(c config) map[string]any {
	var only []string
	for _, n := range scenarioNames {
		if c.selected[n] {
			only = append(only, n)
		}
	}
	return map[string]any{
		"scenarios": only, "quick": c.quick, "runs": c.runs, "relay_rows": c.relayRows, "relays": c.relays, "pipeline_rows": c.pipeRows,
		"senders": c.senders, "sender_concurrency": c.concurrency, "latency_rate": c.rate,
		"latency_writers": c.writers, "latency_duration": c.duration.String(), "latency_warmup": c.warmup.String(),
		"scale_rows_per_sender": c.scaleRows, "scale_senders": c.scaleSenders,
		"scale_latency": c.scaleLatency.String(), "external_nats": c.natsURL != "",
		"scheduled_rows": c.scheduledRows, "due_rows": c.dueRows, "due_spread": c.dueSpread.String(),
	}
}

// percentile returns the p-th percentile (0..100) of sorted durations by
// the nearest-rank method, or 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// latencySummary is p50/p95/p99/max of a set of durations, in ms.
type latencySummary struct {
	// N is how many latencies were summarized.
	N int `json:"n"`
	// P50, P95, P99 and Max are in milliseconds (nearest rank).
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// Below counts negative latencies (clock order inverted by scheduling);
	// more than a few would make the figures suspect.
	Below int `json:"negative"`
}

func summarize(ds []time.Duration) latencySummary {
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	s := latencySummary{N: len(ds)}
	if len(ds) == 0 {
		return s
	}
	s.P50, s.P95, s.P99, s.Max = ms(percentile(ds, 50)), ms(percentile(ds, 95)), ms(percentile(ds, 99)), ms(ds[len(ds)-1])
	for _, d := range ds {
		if d < 0 {
			s.Below++
		}
	}
	return s
}
