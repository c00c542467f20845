package sender_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/wire"
)

// Readiness follows the sender's own progress: not ready before Run
// consumes, ready while idle (no ping of Postgres or NATS decides it), and
// unready once its claims have failed for longer than the stall allowance.
func TestReadyFollowsTheSendersProgress(t *testing.T) {
	t.Parallel()
	const stall = 300 * time.Millisecond
	s, js := cutOffSender(t, nil)
	if err := s.Ready(stall); err == nil {
		t.Fatal("ready before Run")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitReady := func(what string, ok func(error) bool) error {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := s.Ready(stall)
			if ok(err) {
				return err
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; Ready = %v", what, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Idle, with the database unreachable: nothing to claim, so ready.
	waitReady("ready while idle", func(err error) bool { return err == nil })
	payload := wire.AppendEncode(nil, wire.Send{ID: uuid.New()})
	if _, err := js.Publish(context.Background(), "sms.send", payload); err != nil {
		t.Fatal(err)
	}
	err := waitReady("unready while claims fail", func(err error) bool { return err != nil })
	if !strings.Contains(err.Error(), "postgres") {
		t.Fatalf("Ready = %v, want the failing claims named", err)
	}
}

// A sender stopped while it starts (a SIGTERM right after its start-up
// line, before it has looked up its consumers) stops cleanly: it had taken
// nothing, and its exit must not read as a failure.
func TestStopWhileStartingIsClean(t *testing.T) {
	t.Parallel()
	s, _ := cutOffSender(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run stopped before it started = %v, want nil", err)
	}
}

// cutOffSender returns a sender on a fresh NATS server with the topology,
// whose database nobody listens for (every claim fails) and whose
// provider refuses connections, and the server's JetStream. reg, when not
// nil, receives its metrics.
func cutOffSender(t *testing.T, reg prometheus.Registerer) (*sender.Sender, jetstream.JetStream) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://sendonce@127.0.0.1:1/nothing?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	p, err := provider.New(provider.Config{BaseURL: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sender.New(sender.Config{Pool: pool, JetStream: js, Provider: p, DBTimeout: 500 * time.Millisecond, ShutdownTimeout: time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s, js
}
