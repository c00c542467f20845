package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// benchBacklog is how many pending rows BenchmarkRelayBatch loads at a time.
const benchBacklog = 20_000

// loadPendingForBench empties the outbox and loads n pending rows with COPY,
// as a backlog an application committed while the relay was away.
func loadPendingForBench(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `TRUNCATE sms_evidence, sms_attempts, sms_outbox`); err != nil {
		b.Fatal(err)
	}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		i++
		return []any{uuid.New(), fmt.Sprintf("+1555%07d", i), "Your bench code is 482901. It expires in 10 minutes."}, nil
	})
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"sms_outbox"}, []string{"id", "to_e164", "body"}, src); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRelayBatch is one relay batch end to end: claim pending rows in
// a transaction, publish them asynchronously to JetStream on an embedded
// server (in this process, so a CPU profile shows the server's share too),
// wait for the PubAcks, mark the rows queued, commit. It reports rows/s;
// ns/op is one batch.
//
//	go test ./internal/relay -run '^$' -bench RelayBatch -benchtime 5s -cpuprofile relay.pprof
func BenchmarkRelayBatch(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	srv := natstest.Start(b)
	srv.EnsureTopology(b)
	_, js := srv.Connect(b)
	for _, batch := range []int{500, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			r, err := relay.New(relay.Config{
				Pool: pool, JetStream: js, BatchSize: batch,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			left, rows := 0, 0
			for b.Loop() {
				if left < batch {
					b.StopTimer()
					loadPendingForBench(b, pool, benchBacklog)
					left = benchBacklog
					b.StartTimer()
				}
				n, err := r.RelayBatch(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if n != batch {
					b.Fatalf("relayed %d rows, want %d", n, batch)
				}
				left -= n
				rows += n
			}
			b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
