package streams_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
)

type testWriter struct {
	t  *testing.T
	mu sync.Mutex
	b  strings.Builder
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.b.Write(p)
	w.mu.Unlock()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (w *testWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(&testWriter{t: t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// A broker restarted on an empty store comes back without the topology: the
// keeper notices at the reconnect and recreates it in place, without the
// process restarting.
func TestKeeperRecreatesALostStore(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	topo := srv.EnsureTopology(t)
	_, js := srv.Connect(t, natsReconnectForever()...)
	reg := prometheus.NewRegistry()
	k, err := streams.NewKeeper(streams.KeeperConfig{
		Topology: topo, JetStream: js, Ensure: true, Interval: time.Hour, Logger: logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(k)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	srv.Stop()
	if err := os.RemoveAll(srv.StoreDir()); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	// The interval is an hour: only the reconnect can have triggered it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := topo.Check(cctx, js)
		ccancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("topology not recreated 30s after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitCount(t, reg, 1)
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if _, err := js.Consumer(cctx, streams.Stream, streams.Consumer); err != nil {
		t.Fatalf("consumer after the recreation: %v", err)
	}
}

// With NATS_ENSURE_TOPOLOGY=false the keeper only says so, once, at Error
// level, and recreates nothing.
func TestKeeperWithoutEnsureReports(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	topo := srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	w := &testWriter{t: t}
	k, err := streams.NewKeeper(streams.KeeperConfig{
		Topology: topo, JetStream: js, Ensure: false, Logger: slog.New(slog.NewJSONHandler(w, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !k.Pass(ctx) {
		t.Fatal("Pass did not find the topology in place")
	}
	if err := js.DeleteStream(ctx, streams.Stream); err != nil {
		t.Fatal(err)
	}
	if k.Pass(ctx) || k.Pass(ctx) {
		t.Fatal("Pass found everything after SMS was deleted")
	}
	if n := strings.Count(w.String(), `"level":"ERROR"`); n != 1 {
		t.Fatalf("%d error lines for one loss, want 1:\n%s", n, w.String())
	}
	if err := topo.Check(ctx, js); err == nil {
		t.Fatal("the keeper recreated the stream with Ensure false")
	}
	if !strings.Contains(w.String(), `"stream SMS"`) {
		t.Fatalf("the error line does not name the stream:\n%s", w.String())
	}
}

func waitCount(t *testing.T, reg *prometheus.Registry, want float64) {
	t.Helper()
	waitFor(t, 10*time.Second, "the recreation to be counted", func() bool {
		n, err := testutil.GatherAndCount(reg, "sendonce_nats_topology_recreated_total")
		if err != nil || n != 1 {
			return false
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "sendonce_nats_topology_recreated_total" {
				return mf.GetMetric()[0].GetCounter().GetValue() == want
			}
		}
		return false
	})
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func natsReconnectForever() []nats.Option {
	return []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
}
