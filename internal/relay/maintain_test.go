package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
)

func TestRetentionPurgesOldFinishedRowsInBatches(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ids := e.insert(t, 24)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	old, unknown, recent, unfinished := ids[:11], ids[11:15], ids[15:19], ids[19:]
	exec(`UPDATE sms_outbox SET status = (ARRAY['sent','dead'])[1 + (abs(hashtext(id::text)) % 2)], letter_seq = 1,
		updated_at = now() - interval '2 days' WHERE id = ANY($1)`, old)
	// Retention goes by when a row finished, which only the database
	// writes (the move above stamped it now): as the table's owner, the
	// test moves it back too.
	exec(`UPDATE sms_outbox SET finished_at = updated_at WHERE id = ANY($1)`, old)
	// Unknown rows wait for a person, however old: never purged.
	exec(`UPDATE sms_outbox SET status = 'unknown', updated_at = now() - interval '30 days' WHERE id = ANY($1)`, unknown)
	exec(`UPDATE sms_outbox SET status = 'sent', updated_at = now() - interval '1 hour' WHERE id = ANY($1)`, recent[:3])
	exec(`UPDATE sms_outbox SET finished_at = updated_at WHERE id = ANY($1)`, recent[:3])
	// A dead row whose dead letter is still to be published stays until the
	// reconciler has published it.
	exec(`UPDATE sms_outbox SET status = 'dead', end_reason = 'permanent', updated_at = now() - interval '30 days' WHERE id = ANY($1)`, recent[3:])
	exec(`UPDATE sms_outbox SET finished_at = updated_at WHERE id = ANY($1)`, recent[3:])
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
	var rows, attempts, unknownLeft int
	_ = e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM sms_outbox), (SELECT count(*) FROM sms_attempts),
		(SELECT count(*) FROM sms_outbox WHERE status = 'unknown')`).Scan(&rows, &attempts, &unknownLeft)
	if want := len(unknown) + len(recent) + len(unfinished); rows != want || attempts != want || unknownLeft != len(unknown) {
		t.Fatalf("%d rows (%d unknown) and %d attempts left, want %d (%d unknown)", rows, unknownLeft, attempts, want, len(unknown))
	}
	if got := counter(t, reg, "sendonce_retention_purged_rows_total"); got != float64(len(old)) {
		t.Fatalf("purged counter = %v", got)
	}
	if got := counter(t, reg, "sendonce_retention_last_success_timestamp_seconds"); got < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Fatalf("last success = %v", got)
	}
	if n, _ := r.Purge(ctx); n != 0 {
		t.Fatalf("second purge deleted %d", n)
	}
	if got := counter(t, reg, "sendonce_retention_errors_total"); got != 0 {
		t.Fatalf("errors = %v", got)
	}
	// A purge that fails (here: no statement can finish within its
	// timeout) is counted: the alert's signal.
	failReg := prometheus.NewRegistry()
	failing, err := relay.NewRetention(relay.RetentionConfig{Pool: e.pool, Age: time.Hour, DBTimeout: time.Nanosecond, Registerer: failReg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Purge(ctx); err == nil {
		t.Fatal("a purge whose statements cannot finish succeeded")
	}
	if got := counter(t, failReg, "sendonce_retention_errors_total"); got != 1 {
		t.Fatalf("errors after a failed purge = %v, want 1", got)
	}
	if got := counter(t, failReg, "sendonce_retention_last_success_timestamp_seconds"); got != 0 {
		t.Fatalf("last success after only a failure = %v, want 0", got)
	}
}

// A retention under the hour sendonce_purge keeps is refused when it is
// configured, naming the floor, rather than failing every purge.
func TestRetentionAgeHasAFloor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, age := range []time.Duration{time.Second, 59 * time.Minute} {
		_, err := relay.NewRetention(relay.RetentionConfig{Pool: e.pool, Age: age})
		if err == nil || !strings.Contains(err.Error(), "1h0m0s") {
			t.Errorf("Age %s: %v; want a refusal naming the floor", age, err)
		}
	}
	if _, err := relay.NewRetention(relay.RetentionConfig{Pool: e.pool, Age: outbox.PurgeFloor}); err != nil {
		t.Errorf("Age at the floor: %v", err)
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
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
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
