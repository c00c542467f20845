package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// gauges returns every sample of reg as "name{v1,v2}" -> value.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var vals []string
			for _, l := range m.GetLabel() {
				vals = append(vals, l.GetValue())
			}
			out[mf.GetName()+"{"+strings.Join(vals, ",")+"}"] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

func TestMonitor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ids := e.insert(t, 7)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE sms_outbox SET created_at = now() - interval '90 seconds' WHERE id = $1`, ids[0])
	exec(`UPDATE sms_outbox SET status = 'queued', updated_at = now() - interval '10 minutes' WHERE id = ANY($1)`, ids[1:3])
	exec(`UPDATE sms_outbox SET status = 'sent', updated_at = now() - interval '2 hours' WHERE id = $1`, ids[3])
	// Unknown rows are never purged, so they are not "finished" for the
	// retention gauge.
	exec(`UPDATE sms_outbox SET status = 'unknown', updated_at = now() - interval '30 days' WHERE id = $1`, ids[4])
	exec(`SELECT sendonce_suppress_inbound('+15550009991', 'twilio', 'STOP', false)`)
	exec(`SELECT sendonce_suppress_inbound('+15550009992', 'vonage', 'STOP', false)`)
	exec(`SELECT sendonce_suppress_add('{+15550009993}', 'operator', 'complaint', 'alice')`)

	reg := prometheus.NewRegistry()
	mon, err := relay.NewMonitor(relay.MonitorConfig{Pool: e.pool, JetStream: e.js, Registerer: reg, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mon.Measure(ctx)
	g := gauges(t, reg)
	within := func(name string, lo, hi float64) {
		t.Helper()
		if v, ok := g[name]; !ok || v < lo || v > hi {
			t.Errorf("%s = %v (present %v), want within [%v, %v]", name, v, ok, lo, hi)
		}
	}
	within("sendonce_outbox_rows{pending}", 3, 3)
	within("sendonce_outbox_rows{queued}", 2, 2)
	within("sendonce_outbox_rows{sending}", 0, 0)
	within("sendonce_outbox_rows_estimated{pending}", 0, 0)
	within("sendonce_outbox_oldest_pending_age_seconds{}", 89, 200)
	within("sendonce_outbox_oldest_inflight_age_seconds{}", 599, 700)
	within("sendonce_outbox_oldest_finished_age_seconds{}", 7199, 7300)
	within("sendonce_table_live_rows{sms_outbox}", 0, 1e9)
	within("sendonce_table_dead_rows{sms_attempts}", 0, 1e9)
	within("sendonce_postgres_oldest_transaction_age_seconds{}", 0, 3600)
	within("sendonce_stream_messages{"+streams.Stream+"}", 0, 0)
	within("sendonce_stream_max_bytes{"+streams.Stream+"}", 1, 1e15)
	within("sendonce_consumer_max_ack_pending{"+streams.Consumer+","+streams.Stream+"}", 1, 1e9)
	within("sendonce_outbox_receipts_overdue_rows{}", 0, 0)
	within("sendonce_outbox_oldest_receipt_overdue_age_seconds{}", 0, 0)
	within("sendonce_suppression_list_entries{inbound}", 2, 2)
	within("sendonce_suppression_list_entries{operator}", 1, 1)
	within("sendonce_suppression_list_entries{refusal}", 0, 0)
	within("sendonce_suppression_list_estimated{}", 0, 0)
	for _, m := range []string{"oldest_pending", "oldest_inflight", "oldest_finished", "rows", "receipts_overdue", "tables", "suppressions", "transactions", "streams"} {
		within("sendonce_measure_up{"+m+"}", 1, 1)
		within("sendonce_measure_last_success_timestamp_seconds{"+m+"}", float64(time.Now().Add(-time.Minute).Unix()), float64(time.Now().Unix()+1))
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// A count that reaches its cap reports the planner's estimate instead, and
// says so: the cost of a measurement does not grow with the backlog.
func TestMonitorEstimatesAboveTheCountCap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.insert(t, 50)
	if _, err := e.pool.Exec(context.Background(), `ANALYZE sms_outbox`); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	mon, err := relay.NewMonitor(relay.MonitorConfig{Pool: e.pool, CountCap: 10, Registerer: reg, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mon.Measure(context.Background())
	g := gauges(t, reg)
	if g["sendonce_outbox_rows_estimated{pending}"] != 1 || g["sendonce_outbox_rows{pending}"] < 10 {
		t.Fatalf("pending = %v (estimated %v), want an estimate of at least the cap",
			g["sendonce_outbox_rows{pending}"], g["sendonce_outbox_rows_estimated{pending}"])
	}
	if g["sendonce_outbox_rows_estimated{queued}"] != 0 {
		t.Fatal("a count under the cap marked as estimated")
	}
}

// When the database stops answering, the gauges keep their last values (so
// the alerts they feed stay raised) and the measurement says since when it
// has not succeeded. Before: every depth gauge vanished, and the lag and
// stuck-rows alerts resolved during the largest backlogs.
func TestMonitorKeepsTheLastValuesWhenMeasuringFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insert(t, 4)
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET created_at = now() - interval '10 minutes' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	// A pool of its own, closed to stand for a database that stopped
	// answering.
	pool, err := pgxpool.New(context.Background(), e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	mon, err := relay.NewMonitor(relay.MonitorConfig{Pool: pool, Registerer: reg, Timeout: time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mon.Measure(context.Background())
	before := gauges(t, reg)
	pool.Close()
	mon.Measure(context.Background())
	after := gauges(t, reg)
	for _, name := range []string{"sendonce_outbox_oldest_pending_age_seconds{}", "sendonce_outbox_rows{pending}",
		"sendonce_measure_last_success_timestamp_seconds{oldest_pending}"} {
		if after[name] != before[name] || after[name] == 0 {
			t.Errorf("%s: %v before the failure, %v after; want the last value kept", name, before[name], after[name])
		}
	}
	if after["sendonce_measure_up{oldest_pending}"] != 0 || after["sendonce_measure_up{rows}"] != 0 {
		t.Fatal("measure_up still 1 after failing")
	}
}

// The backlog of the senders' receipt sweep: the sent rows it marked with
// an overdue receipt, and how long ago the oldest of them was sent; a sent
// row not marked (its receipt not overdue, or its looks over) is not in
// it, nor is a row a receipt settled. Measured as the relay's role, capped
// like the other counts.
func TestMonitorMeasuresOverdueReceipts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ids := e.insert(t, 6)
	for i, ago := range []string{"3 hours", "2 hours", "90 minutes"} {
		if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sent', lookup_pending = true,
			next_attempt_at = now() + interval '1 hour', updated_at = now() - $2::interval WHERE id = $1`, ids[i], ago); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sent', updated_at = now() - interval '5 hours' WHERE id = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'delivered', updated_at = now() - interval '6 hours' WHERE id = $1`, ids[4]); err != nil {
		t.Fatal(err)
	}
	relayPool, err := pgxpool.New(ctx, pgtest.AsRole(t, e.pool.Config().ConnString(), "sendonce_relay"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayPool.Close)
	for _, tt := range []struct {
		cap      int
		rows     float64
		min, max float64
	}{
		{0, 3, 3*3600 - 60, 3*3600 + 60},
		// Two entries read: by when their next look is due, so the age
		// is that of the oldest of those read.
		{2, 2, 90*60 - 60, 3*3600 + 60},
	} {
		reg := prometheus.NewRegistry()
		mon, err := relay.NewMonitor(relay.MonitorConfig{Pool: relayPool, CountCap: tt.cap, Registerer: reg, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		mon.Measure(ctx)
		g := gauges(t, reg)
		if g["sendonce_measure_up{receipts_overdue}"] != 1 {
			t.Fatalf("cap %d: the measurement failed as the relay's role", tt.cap)
		}
		if got := g["sendonce_outbox_receipts_overdue_rows{}"]; got != tt.rows {
			t.Errorf("cap %d: %v rows with overdue receipts, want %v", tt.cap, got, tt.rows)
		}
		if age := g["sendonce_outbox_oldest_receipt_overdue_age_seconds{}"]; age < tt.min || age > tt.max {
			t.Errorf("cap %d: oldest overdue receipt %vs, want within [%v, %v]", tt.cap, age, tt.min, tt.max)
		}
	}
}
