package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	internal "github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/outbox"
)

// The relay publishes each row to its priority's lane, urgent rows first,
// and the oldest urgent row's age is measured from its own index.
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
	// Each row went to its lane: the lanes' consumers hold them.
	for lane, want := range map[string]int{"senders_urgent": 1, "senders": 1, "senders_bulk": 2} {
		c, err := e.js.Consumer(ctx, "SMS", lane)
		if err != nil {
			t.Fatal(err)
		}
		if got := int(c.CachedInfo().NumPending); got != want {
			t.Errorf("consumer %s has %d messages pending, want %d", lane, got, want)
		}
	}
	age, err := internal.OldestUrgent(ctx, e.pool)
	if err != nil || age < 119*time.Second || age > 300*time.Second {
		t.Errorf("oldest urgent row %s, %v; want about 2 minutes", age, err)
	}
}
