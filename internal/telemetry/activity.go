package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Activity records the outcomes of a piece of work a process repeats (a
// relay batch, a fetch, a claim) in atomics, so that readiness can be
// decided from the process's own recent progress instead of by pinging the
// shared services on every probe: a probe that pings Postgres or NATS turns
// a leader election or a failover into every pod unready at once, and says
// nothing of a loop that is stuck while the services answer.
//
// The zero value is ready to use; its methods are safe for concurrent use.
type Activity struct {
	lastOK, lastFail, failingSince atomic.Int64 // unix nanoseconds; 0: never
}

// OK records a success.
func (a *Activity) OK() {
	a.lastOK.Store(time.Now().UnixNano())
	a.failingSince.Store(0)
}

// Fail records a failure.
func (a *Activity) Fail() {
	now := time.Now().UnixNano()
	a.lastFail.Store(now)
	a.failingSince.CompareAndSwap(0, now)
}

// LastOK returns the time of the last success (zero: never).
func (a *Activity) LastOK() time.Time { return fromNanos(a.lastOK.Load()) }

// FailingSince returns the time of the first failure since the last
// success (zero: the last outcome was a success, or there was none).
func (a *Activity) FailingSince() time.Time { return fromNanos(a.failingSince.Load()) }

// Fresh returns nil when the last success is at most within before now, and
// otherwise an error naming what (for work that runs all the time, such as
// the relay's batches, which run every poll interval even when idle).
func (a *Activity) Fresh(what string, now time.Time, within time.Duration) error {
	last := a.LastOK()
	switch {
	case last.IsZero():
		return fmt.Errorf("%s: no success yet", what)
	case now.Sub(last) > within:
		return fmt.Errorf("%s: no success for %s (last at %s)", what, now.Sub(last).Round(time.Second), last.UTC().Format(time.RFC3339))
	}
	return nil
}

// Failing returns an error naming what when every outcome for longer than
// grace before now was a failure (for work that only runs when there is
// something to do, such as a sender's claims: idleness is no failure).
func (a *Activity) Failing(what string, now time.Time, grace time.Duration) error {
	since := a.FailingSince()
	if !since.IsZero() && now.Sub(since) > grace {
		return fmt.Errorf("%s: failing for %s", what, now.Sub(since).Round(time.Second))
	}
	return nil
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Dependencies exports sendonce_dependency_up{dependency}: 1 when the
// process reached the dependency on its last check. Each check runs at most
// once per Every (default 10s, whatever the scrape rate) within Timeout
// (default 2s); the alerting rules page when every process of a job has
// lost one.
type Dependencies struct {
	// Every is the shortest time between two checks of one dependency.
	Every time.Duration
	// Timeout bounds one check.
	Timeout time.Duration

	mu     sync.Mutex
	checks []*depCheck
	desc   *prometheus.Desc
}

type depCheck struct {
	name  string
	check func(context.Context) error
	at    time.Time
	up    bool
}

// Add registers a check; call it before the collector is registered.
func (d *Dependencies) Add(name string, check func(context.Context) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checks = append(d.checks, &depCheck{name: name, check: check})
}

func (d *Dependencies) descriptor() *prometheus.Desc {
	if d.desc == nil {
		d.desc = prometheus.NewDesc("sendonce_dependency_up",
			"1 if this process reached the dependency (postgres, nats) on its last check, else 0.", []string{"dependency"}, nil)
	}
	return d.desc
}

// Describe implements prometheus.Collector.
func (d *Dependencies) Describe(ch chan<- *prometheus.Desc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch <- d.descriptor()
}

// Collect implements prometheus.Collector.
func (d *Dependencies) Collect(ch chan<- prometheus.Metric) {
	d.mu.Lock()
	defer d.mu.Unlock()
	every, timeout := d.Every, d.Timeout
	if every <= 0 {
		every = 10 * time.Second
	}
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	for _, c := range d.checks {
		if time.Since(c.at) >= every {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			c.up, c.at = c.check(ctx) == nil, time.Now()
			cancel()
		}
		v := 0.0
		if c.up {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(d.descriptor(), prometheus.GaugeValue, v, c.name)
	}
}

// Readiness is what /readyz asks: "starting" until the process sets its
// check, once its work has started.
type Readiness struct {
	check atomic.Pointer[func() error]
}

// Set installs the check.
func (r *Readiness) Set(check func() error) { r.check.Store(&check) }

// Check runs the check; it has the shape Listen and Start take.
func (r *Readiness) Check(context.Context) error {
	c := r.check.Load()
	if c == nil {
		return errors.New("starting")
	}
	return (*c)()
}
