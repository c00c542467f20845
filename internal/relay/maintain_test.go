package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sendonce/sendonce/internal/relay"
)

func TestRetentionPurgesOldFinishedRowsInBatches(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ids := e.insert(t, 20)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	old, recent, unfinished := ids[:11], ids[11:15], ids[15:]
	exec(`UPDATE sms_outbox SET status = (ARRAY['sent','dead','unknown'])[1 + (abs(hashtext(id::text)) % 3)],
		updated_at = now() - interval '2 days' WHERE id = ANY($1)`, old)
	exec(`UPDATE sms_outbox SET status = 'sent', updated_at = now() - interval '1 hour' WHERE id = ANY($1)`, recent)
	exec(`UPDATE sms_outbox SET status = 'queued', updated_at = now() - interval '30 days' WHERE id = ANY($1)`, unfinished)
	exec(`INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome) SELECT id, 1, now(), 'sent' FROM sms_outbox`)

	reg := prometheus.NewRegistry()
	r, err := relay.NewRetention(relay.RetentionConfig{Pool: e.pool, Age: 24 * time.Hour, BatchSize: 3, Pause: time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.Purge(ctx)
	if err != nil || n != int64(len(old)) {
		t.Fatalf("Purge = %d, %v; want %d", n, err, len(old))
	}
	var rows, attempts int
	_ = e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM sms_outbox), (SELECT count(*) FROM sms_attempts)`).Scan(&rows, &attempts)
	if want := len(recent) + len(unfinished); rows != want || attempts != want {
		t.Fatalf("%d rows and %d attempts left, want %d each", rows, attempts, want)
	}
	if got := counter(t, reg, "sendonce_retention_purged_rows_total"); got != float64(len(old)) {
		t.Fatalf("purged counter = %v", got)
	}
	if n, _ := r.Purge(ctx); n != 0 {
		t.Fatalf("second purge deleted %d", n)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestDepthCollector(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ids := e.insert(t, 6)
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET created_at = now() - interval '90 seconds' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'queued', updated_at = now() - interval '10 minutes' WHERE id = ANY($1)`, ids[1:3]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sent' WHERE id = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	c := relay.NewDepthCollector(e.pool, nil)
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	want := `
# HELP sendonce_outbox_rows Unfinished outbox rows by status (pending, queued, sending).
# TYPE sendonce_outbox_rows gauge
sendonce_outbox_rows{status="pending"} 3
sendonce_outbox_rows{status="queued"} 2
sendonce_outbox_rows{status="sending"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "sendonce_outbox_rows"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		v := mf.GetMetric()[0].GetGauge().GetValue()
		switch mf.GetName() {
		case "sendonce_outbox_oldest_pending_age_seconds":
			if v < 89 || v > 200 {
				t.Errorf("oldest pending age %v, want about 90", v)
			}
		case "sendonce_outbox_oldest_inflight_age_seconds":
			if v < 599 || v > 700 {
				t.Errorf("oldest in-flight age %v, want about 600", v)
			}
		}
	}
}

// The relay's and the reconciler's metrics pass the Prometheus linter and
// carry no per-message label values.
func TestRelayMetricsLint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	e.newRelay(t, relay.Config{Registerer: reg})
	if _, err := relay.NewReconciler(relay.ReconcilerConfig{Pool: e.pool, JetStream: e.js, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.NewRetention(relay.RetentionConfig{Pool: e.pool, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}
