package relay_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/outbox"
)

// The relay publishes each row to its priority's lane, urgent rows first,
// and the lane collector sees the backlogs and the oldest urgent row.
func TestLanes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{
			{To: "+15551234567", Body: "bulk 1", Priority: outbox.Bulk},
			{To: "+15551234567", Body: "bulk 2", Priority: outbox.Bulk},
			{To: "+15551234567", Body: "normal"},
			{To: "+15551234567", Body: "urgent", Priority: outbox.Urgent},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET created_at = now() - interval '2 minutes' WHERE priority = 1`); err != nil {
		t.Fatal(err)
	}
	c := relay.NewLaneCollector(e.pool, e.js, nil)
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	// One batch of one row: the urgent row goes first, whatever its age.
	r := e.newRelay(t, relay.Config{BatchSize: 1})
	if n, err := r.RelayBatch(ctx); err != nil || n != 1 {
		t.Fatalf("RelayBatch = %d, %v", n, err)
	}
	var status string
	if err := e.pool.QueryRow(ctx, `SELECT status FROM sms_outbox WHERE priority = 1`).Scan(&status); err != nil || status != "queued" {
		t.Fatalf("the urgent row is %s after the first batch of one, want queued first", status)
	}
	for range 3 {
		if _, err := r.RelayBatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(relay.NewLaneCollector(e.pool, e.js, nil))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	backlog := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "sendonce_lane_backlog_messages":
				backlog[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			case "sendonce_outbox_oldest_urgent_age_seconds":
				if v := m.GetGauge().GetValue(); v < 119 || v > 300 {
					t.Errorf("oldest urgent age %v, want about 120", v)
				}
			case "sendonce_lanes_up":
				if m.GetGauge().GetValue() != 1 {
					t.Error("lanes not measured")
				}
			}
		}
	}
	if backlog["urgent"] != 1 || backlog["normal"] != 1 || backlog["bulk"] != 2 {
		t.Fatalf("lane backlogs %v, want urgent 1, normal 1, bulk 2", backlog)
	}
}
