package sender_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/wire"
)

// benchWave is how many messages one BenchmarkSenderRun operation sends.
const benchWave = 1000

// BenchmarkSenderRun is one sender (Sender.Run, default settings) sending a
// wave of queued rows end to end: pull from the durable consumer, claim in
// Postgres, POST to the stub over loopback HTTP, write the statuses, ack.
// The broker and the stub run in this process, so a CPU profile shows where
// the sender's time goes next to theirs; Postgres is a separate server.
// Each operation publishes benchWave messages for rows loaded beforehand
// (timer stopped) and waits until the stub has delivered them all and the
// rows read sent. It reports msg/s.
//
//	go test ./internal/sender -run '^$' -bench SenderRun -benchtime 10x -cpuprofile sender.pprof
func BenchmarkSenderRun(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	srv := natstest.Start(b)
	srv.EnsureTopology(b)
	_, js := srv.Connect(b)
	stub, err := smsstub.New(smsstub.Config{})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	b.Cleanup(hs.Close)
	b.Cleanup(func() { _ = stub.Close() })
	prov, err := provider.New(provider.Config{BaseURL: hs.URL, Idempotent: true, MaxConns: 32, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	s, err := sender.New(sender.Config{
		Pool: pool, JetStream: js, Provider: prov, Name: "bench",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})

	sent := 0
	for b.Loop() {
		b.StopTimer()
		ids := pgtest.LoadRows(b, pool, benchWave, string(outbox.StatusQueued))
		b.StartTimer()
		publishWaveForBench(b, js, ids)
		want := int64(sent + benchWave)
		deadline := time.Now().Add(time.Minute)
		for stub.Stats().Deliveries < want {
			if time.Now().After(deadline) {
				b.Fatalf("stub delivered %d of %d within a minute", stub.Stats().Deliveries, want)
			}
			time.Sleep(time.Millisecond)
		}
		waitSentForBench(b, pool, benchWave, deadline)
		sent += benchWave
	}
	b.ReportMetric(float64(sent)/b.Elapsed().Seconds(), "msg/s")
}

// publishWaveForBench publishes one sms.send message per id, as the relay
// does, and waits for the PubAcks.
func publishWaveForBench(b *testing.B, js jetstream.JetStream, ids []uuid.UUID) {
	b.Helper()
	futures := make([]jetstream.PubAckFuture, 0, len(ids))
	for _, id := range ids {
		msg := &nats.Msg{Subject: streams.SubjectSend, Data: wire.AppendEncode(nil, wire.Send{ID: id})}
		f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(id.String()))
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
	}
	timeout := time.After(30 * time.Second)
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		case <-timeout:
			b.Fatal("no PubAck within 30s")
		}
	}
}

// waitSentForBench waits until n rows read sent: the stub counts a delivery
// before the sender's status write commits.
func waitSentForBench(b *testing.B, pool *pgxpool.Pool, n int, deadline time.Time) {
	b.Helper()
	for {
		var sent int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = 'sent'`).Scan(&sent); err != nil {
			b.Fatal(err)
		}
		if sent == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d rows sent", sent, n)
		}
		time.Sleep(time.Millisecond)
	}
}
