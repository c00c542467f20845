package telemetry_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sendonce/sendonce/internal/telemetry"
)

func TestActivity(t *testing.T) {
	t.Parallel()
	const window = time.Minute
	tests := []struct {
		name         string
		record       func(a *telemetry.Activity)
		later        time.Duration // how long after the records readiness is asked
		fresh, fails bool          // whether Fresh / Failing report an error
	}{
		{"never ran", func(*telemetry.Activity) {}, 0, true, false},
		{"just succeeded", func(a *telemetry.Activity) { a.OK() }, 0, false, false},
		{"succeeded long ago, idle since", func(a *telemetry.Activity) { a.OK() }, 2 * window, true, false},
		{"failed once just now", func(a *telemetry.Activity) { a.OK(); a.Fail() }, 0, false, false},
		{"failing for longer than the window", func(a *telemetry.Activity) { a.OK(); a.Fail(); a.Fail() }, 2 * window, true, true},
		{"failed, then recovered", func(a *telemetry.Activity) { a.Fail(); a.OK() }, 2 * window, true, false},
		{"recovered just now", func(a *telemetry.Activity) { a.Fail(); a.OK() }, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var a telemetry.Activity
			tt.record(&a)
			now := time.Now().Add(tt.later)
			if err := a.Fresh("batch", now, window); (err != nil) != tt.fresh {
				t.Errorf("Fresh = %v, want error %v", err, tt.fresh)
			} else if err != nil && !strings.Contains(err.Error(), "batch") {
				t.Errorf("Fresh error %q does not name the activity", err)
			}
			if err := a.Failing("claim", now, window); (err != nil) != tt.fails {
				t.Errorf("Failing = %v, want error %v", err, tt.fails)
			}
		})
	}
}

func TestBuildInfo(t *testing.T) {
	t.Parallel()
	reg := telemetry.NewRegistry()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sendonce_build_info" {
			continue
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if m.GetGauge().GetValue() != 1 || labels["goversion"] != runtime.Version() || labels["version"] == "" {
			t.Fatalf("sendonce_build_info = %v %v", m.GetGauge().GetValue(), labels)
		}
		return
	}
	t.Fatal("no sendonce_build_info")
}

func TestDependencies(t *testing.T) {
	t.Parallel()
	var pgDown atomic.Bool
	var checks atomic.Int64
	d := &telemetry.Dependencies{Every: time.Hour}
	d.Add("postgres", func(context.Context) error {
		checks.Add(1)
		if pgDown.Load() {
			return errors.New("connection refused")
		}
		return nil
	})
	d.Add("nats", func(context.Context) error { return errors.New("not connected") })
	want := `
# HELP sendonce_dependency_up 1 if this process reached the dependency (postgres, nats) on its last check, else 0.
# TYPE sendonce_dependency_up gauge
sendonce_dependency_up{dependency="nats"} 0
sendonce_dependency_up{dependency="postgres"} 1
`
	if err := testutil.CollectAndCompare(d, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	// Scrapes within Every reuse the last check.
	pgDown.Store(true)
	if err := testutil.CollectAndCompare(d, strings.NewReader(want)); err != nil || checks.Load() != 1 {
		t.Fatalf("second scrape: %v, %d checks", err, checks.Load())
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(d); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}
