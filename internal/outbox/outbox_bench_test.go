package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The benchmarks below measure the outbox statements on the hot paths
// against a real Postgres (TEST_DATABASE_URL, else the local service), each
// operation committed as in production, so the figures include the WAL
// flush of every commit. Rows are loaded with COPY with the timer stopped
// and reloaded when a run has used them up, so each operation works on
// fresh rows in the state production finds them in:
//
//	go test ./internal/outbox -run '^$' -bench . -benchtime 5s

// benchRefill is how many rows a benchmark loads at a time.
const benchRefill = 20_000

// BenchmarkClaimPendingMarkQueued is the relay's transaction without the
// publishing: claim a batch of pending rows FOR UPDATE SKIP LOCKED, mark
// them queued with their stream sequences, commit. Batch 500 is the relay's
// default.
func BenchmarkClaimPendingMarkQueued(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	for _, batch := range []int{100, 500, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			left := 0
			rows := 0
			seqs := make([]int64, batch)
			for i := range seqs {
				seqs[i] = int64(i + 1)
			}
			for b.Loop() {
				if left < batch {
					b.StopTimer()
					pgtest.LoadRows(b, pool, benchRefill, string(outbox.StatusPending))
					left = benchRefill
					b.StartTimer()
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					claimed, err := outbox.ClaimPending(ctx, tx, batch)
					if err != nil {
						return err
					}
					ids := make([]uuid.UUID, len(claimed))
					for i, p := range claimed {
						ids[i] = p.ID
					}
					n, err := outbox.MarkQueued(ctx, tx, ids, seqs[:len(ids)])
					if err != nil {
						return err
					}
					if int(n) != batch {
						return fmt.Errorf("marked %d rows, want %d", n, batch)
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				left -= batch
				rows += batch
			}
			b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkClaimForSend is a sender's claim of a batch of queued rows
// (one statement, autocommitted). Batch 32 is the default (the sender's
// concurrency); batch 1 is what a sender gets when messages trickle in one
// at a time, for the per-row cost of a claim that is not batched.
func BenchmarkClaimForSend(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			var ids []uuid.UUID
			rows := 0
			for b.Loop() {
				if len(ids) < batch {
					b.StopTimer()
					ids = pgtest.LoadRows(b, pool, benchRefill, string(outbox.StatusQueued))
					b.StartTimer()
				}
				claims, err := outbox.ClaimForSend(ctx, pool, ids[:batch], nil, 25*time.Second, uuid.New())
				if err != nil {
					b.Fatal(err)
				}
				if len(claims) != batch || claims[0].Result != outbox.Claimed {
					b.Fatalf("claimed %d rows (first %v), want %d claimed", len(claims), claims[0].Result, batch)
				}
				ids = ids[batch:]
				rows += batch
			}
			b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkWriteResults is a sender's status write: a batch of sent
// results and their attempts-log records in one transaction. Batch 256 is
// the default WriteBatch; batch 1 is the cost per row when the writer finds
// one result at a time.
func BenchmarkWriteResults(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	for _, batch := range []int{1, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			var ids []uuid.UUID
			rows := 0
			results := make([]outbox.Result, batch)
			attempts := make([]outbox.Attempt, batch)
			for b.Loop() {
				if len(ids) < batch {
					b.StopTimer()
					ids = pgtest.LoadRows(b, pool, benchRefill, string(outbox.StatusSending))
					b.StartTimer()
				}
				now := time.Now()
				for i, id := range ids[:batch] {
					results[i] = outbox.Result{ID: id, Status: outbox.StatusSent, ProviderRef: "msg_" + id.String()[:12]}
					attempts[i] = outbox.Attempt{OutboxID: id, Number: 1, StartedAt: now, Latency: 3 * time.Millisecond,
						Outcome: "sent", HTTPStatus: 201, Sender: "bench"}
				}
				var n int64
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					applied, err := outbox.ApplyResults(ctx, tx, results, attempts, false)
					n = int64(len(applied))
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				if int(n) != batch {
					b.Fatalf("wrote %d rows, want %d", n, batch)
				}
				ids = ids[batch:]
				rows += batch
			}
			b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
