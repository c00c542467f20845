package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	app "github.com/sendonce/sendonce/outbox"
)

func enqueue(t *testing.T, pool *pgxpool.Pool, to, body string) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		id, err = app.Enqueue(context.Background(), tx, to, body)
		return err
	})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return id
}

func TestRelayClaimSkipsLockedRows(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		enqueue(t, pool, "+15551234567", "x")
	}
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	first, err := outbox.ClaimPending(ctx, tx1, 6)
	if err != nil || len(first) != 6 {
		t.Fatalf("claim 1: %d rows, %v", len(first), err)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	second, err := outbox.ClaimPending(ctx, tx2, 6)
	if err != nil || len(second) != 4 {
		t.Fatalf("claim 2: %d rows, %v (want the 4 unlocked)", len(second), err)
	}
	seen := map[uuid.UUID]bool{}
	for _, p := range append(first, second...) {
		if seen[p.ID] {
			t.Fatalf("row %s claimed twice", p.ID)
		}
		seen[p.ID] = true
	}
	ids := make([]uuid.UUID, len(second))
	for i, p := range second {
		ids[i] = p.ID
	}
	if n, err := outbox.MarkQueued(ctx, tx2, ids, []int64{1, 2, 3, 4}); err != nil || n != 4 {
		t.Fatalf("MarkQueued = %d, %v", n, err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = tx1.Rollback(ctx)
	var pending, queued int
	_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status='pending'), count(*) FILTER (WHERE status='queued') FROM sms_outbox`).Scan(&pending, &queued)
	if pending != 6 || queued != 4 {
		t.Fatalf("pending=%d queued=%d, want 6 and 4 (a rolled-back claim returns rows)", pending, queued)
	}
}
