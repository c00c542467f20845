package service_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

func TestMain(m *testing.M) { testkit.Main(m) }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// open binds the settings from env as a binary would and opens them.
func open(t *testing.T, env map[string]string) *service.Conns {
	t.Helper()
	var c service.Settings
	s := envflag.New("test", testkit.EnvMap(env), io.Discard)
	service.Bind(s, &c, "127.0.0.1:0")
	if root, code := service.Parse("test", s, nil, &c, io.Discard); root == nil {
		t.Fatalf("parse: exit %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns, err := service.Open(ctx, c, service.Options{Name: "test", MinConns: 3}, discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conns.Close)
	return conns
}

// Open creates the topology on a fresh server; with
// NATS_ENSURE_TOPOLOGY=false it only checks, and names the setting.
func TestOpenEnsuresTheTopology(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": srv.URL(), "NATS_ENSURE_TOPOLOGY": "false"}

	var c service.Settings
	s := envflag.New("test", testkit.EnvMap(env), io.Discard)
	service.Bind(s, &c, "")
	if root, _ := service.Parse("test", s, nil, &c, io.Discard); root == nil {
		t.Fatal("parse failed")
	}
	if _, err := service.Open(context.Background(), c, service.Options{Name: "test"}, discard); err == nil || !strings.Contains(err.Error(), "NATS_ENSURE_TOPOLOGY=false") {
		t.Fatalf("Open without the streams, checking only: %v", err)
	}

	delete(env, "NATS_ENSURE_TOPOLOGY")
	conns := open(t, env)
	if _, err := conns.JS.Consumer(context.Background(), streams.Stream, streams.Consumer); err != nil {
		t.Fatalf("the consumer was not created: %v", err)
	}
	if n := conns.Pool.Config().MaxConns; n < 3 {
		t.Fatalf("pool of %d connections, want at least 3", n)
	}
	// The work stream lost (a broker's store wiped): the keeper recreates
	// it in place, with the flow bucket.
	if err := conns.JS.DeleteStream(context.Background(), streams.Stream); err != nil {
		t.Fatal(err)
	}
	if !conns.Keeper.Pass(context.Background()) {
		t.Fatal("the keeper did not recreate the work stream")
	}
	if _, err := conns.JS.Stream(context.Background(), streams.Stream); err != nil {
		t.Fatalf("the work stream after the keeper's pass: %v", err)
	}
}

// The telemetry endpoint serves from before the connections: /healthz is
// alive, /readyz "starting" until the component sets its check, which is
// then asked along with the NATS connection's state (no ping on a probe);
// the dependency gauges follow the connections.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	addr := "127.0.0.1:" + strconv.Itoa(testport.Reserve(t))
	var logs testkit.Buffer
	tel, err := service.StartTelemetry(addr, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Stop()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz before Open = %d", code)
	}
	// The body says ready or not, nothing more; the reason goes to the
	// log, when it changes. A result holds for telemetry.ReadyCache.
	notReady := func(what, reason string) {
		t.Helper()
		testkit.WaitFor(t, 10*time.Second, "/readyz 503 "+what+" and the log saying "+reason, func() bool {
			code, body := get("/readyz")
			if code == 503 && body != "not ready\n" {
				t.Fatalf("/readyz %s = %d %q, want 503 \"not ready\"", what, code, body)
			}
			return code == 503 && (strings.Contains(logs.String(), "reason="+reason) || strings.Contains(logs.String(), "reason=\""+reason))
		})
	}
	notReady("before Open", "starting")
	conns, err := service.Open(context.Background(), service.Settings{Database: service.Database{URL: url}, NATS: natsconn.Config{URL: srv.URL()}, Topology: streams.Settings{Ensure: true}},
		service.Options{Telemetry: tel, Name: "test"}, discard)
	if err != nil {
		t.Fatal(err)
	}
	defer conns.Close()
	var componentErr atomic.Value
	componentErr.Store("")
	tel.SetReady(func() error {
		if e := componentErr.Load().(string); e != "" {
			return errors.New(e)
		}
		return nil
	})
	testkit.WaitFor(t, 10*time.Second, "/readyz 200", func() bool { code, _ := get("/readyz"); return code == 200 })
	componentErr.Store("relay batch: no success for 1m0s")
	notReady("with the component stalled", "relay batch")
	componentErr.Store("")
	mfs, err := tel.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	up := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "sendonce_dependency_up" {
			for _, m := range mf.GetMetric() {
				up[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if up["postgres"] != 1 || up["nats"] != 1 {
		t.Fatalf("dependency gauges %v, want postgres and nats up", up)
	}
	conns.NC.Close()
	notReady("with NATS closed", "nats")
}

func TestOpenNamesTheDatabaseSetting(t *testing.T) {
	t.Parallel()
	c := service.Settings{Database: service.Database{URL: "postgres://postgres@127.0.0.1:1/none?connect_timeout=2"}}
	if _, err := service.Open(context.Background(), c, service.Options{}, discard); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("Open = %v, want an error naming DATABASE_URL", err)
	}
}

// One loop failing stops the others, and its error is the result.
func TestRunOneFailingLoopStopsTheOthers(t *testing.T) {
	t.Parallel()
	conns := &service.Conns{}
	boom := errors.New("boom")
	stopped := make(chan struct{})
	waiter := func(ctx context.Context) error {
		<-ctx.Done()
		close(stopped)
		return nil
	}
	failing := func(context.Context) error { return boom }
	if err := conns.Run(context.Background(), time.Minute, discard, waiter, failing); !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the failing loop's error", err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the other loop was not stopped")
	}
}

// A loop that does not finish within the shutdown bound makes Run fail
// rather than hang; a clean stop drains NATS.
func TestRunShutdown(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	conns := open(t, map[string]string{"DATABASE_URL": pgtest.NewMigrated(t), "NATS_URL": srv.URL()})

	release := make(chan struct{})
	defer close(release)
	stuck := func(context.Context) error { <-release; return nil }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := conns.Run(ctx, 50*time.Millisecond, discard, stuck); err == nil || !strings.Contains(err.Error(), "shutdown did not finish") {
		t.Fatalf("Run = %v, want a shutdown timeout", err)
	}

	clean := func(ctx context.Context) error { <-ctx.Done(); return nil }
	if err := conns.Run(ctx, time.Minute, discard, clean); err != nil {
		t.Fatal(err)
	}
	if !conns.NC.IsClosed() {
		t.Fatal("the NATS connection was not drained")
	}
}

// gcPercent returns the collector's current target.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestParseSetsGCPercentUnlessGOGC(t *testing.T) {
	// Not parallel: the target is the process's, and t.Setenv forbids it.
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	parse := func(t *testing.T) {
		t.Helper()
		var c service.Settings
		s := envflag.New("relay", testkit.EnvMap(map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", "NATS_URL": "nats://127.0.0.1:4222"}), io.Discard)
		service.Bind(s, &c, "")
		if _, code := service.Parse("relay", s, nil, &c, io.Discard); code != 0 {
			t.Fatalf("Parse exit code %d", code)
		}
	}
	t.Run("unset", func(t *testing.T) {
		t.Setenv("GOGC", "") // restored after the test
		os.Unsetenv("GOGC")
		debug.SetGCPercent(100)
		parse(t)
		if got := gcPercent(); got != service.GCPercent {
			t.Fatalf("GC percent = %d, want %d", got, service.GCPercent)
		}
	})
	t.Run("set", func(t *testing.T) {
		t.Setenv("GOGC", "150")
		debug.SetGCPercent(150) // what the runtime read from GOGC at start
		parse(t)
		if got := gcPercent(); got != 150 {
			t.Fatalf("GC percent = %d with GOGC=150, want 150 kept", got)
		}
	})
}
