package telemetry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/telemetry"
)

func TestEndpoints(t *testing.T) {
	t.Parallel()
	reg := telemetry.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sendonce_test_total", Help: "A test counter."})
	reg.MustRegister(c)
	c.Add(3)
	var broken atomic.Bool
	srv, err := telemetry.Listen("127.0.0.1:0", reg, func(ctx context.Context) error {
		if broken.Load() {
			return errors.New("postgres: connection refused")
		}
		return nil
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz = %d", code)
	}
	broken.Store(true)
	time.Sleep(telemetry.ReadyCache) // the last result holds that long
	if code, body := get("/readyz"); code != 503 || body != "not ready\n" {
		t.Fatalf("/readyz when not ready = %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz must not depend on readiness: %d", code)
	}
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, "sendonce_test_total 3") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics = %d:\n%s", code, body)
	}
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	log, err := telemetry.NewLogger(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.With("component", "relay").Debug("hidden")
	log.With("component", "relay").Info("shown", "outbox_id", "x", "retry_in", 1500*time.Millisecond)
	if strings.Contains(b.String(), "hidden") || !strings.Contains(b.String(), `"component":"relay"`) {
		t.Fatalf("json log = %q", b.String())
	}
	if !strings.Contains(b.String(), `"retry_in":"1.5s"`) {
		t.Fatalf("duration not written as text: %q", b.String())
	}
	if _, err := telemetry.NewLogger(&b, "xml", "info"); err == nil {
		t.Fatal("xml format accepted")
	}
	if _, err := telemetry.NewLogger(&b, "text", "loud"); err == nil {
		t.Fatal("bad level accepted")
	}
}

// /readyz says ready or not and nothing more: the reason (which may name a
// user, a host and a port) goes to the log, credentials scrubbed, once per
// change. Probes share one check per telemetry.ReadyCache, and the server
// closes a client that sends nothing.
func TestReadyz(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	srv, err := telemetry.Listen("127.0.0.1:0", telemetry.NewRegistry(), func(ctx context.Context) error {
		calls.Add(1)
		return errors.New(`failed to connect to user=app database=sendonce: 10.1.2.3:5432 (nats://relay:s3cret-pw@10.1.2.4:4222) password=s3cret-kv`)
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	start := time.Now()
	const probes = 20
	for range probes {
		resp, err := http.Get("http://" + srv.Addr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || string(b) != "not ready\n" {
			t.Fatalf("/readyz = %d %q, want 503 \"not ready\"", resp.StatusCode, b)
		}
	}
	// Probes spread over elapsed time may run the check once per
	// ReadyCache, and no more.
	if n, most := calls.Load(), int64(time.Since(start)/telemetry.ReadyCache)+1; n > most {
		t.Errorf("%d probes ran the check %d times, want at most %d", probes, n, most)
	}
	mu.Lock()
	got := logs.String()
	mu.Unlock()
	if strings.Count(got, "not ready") != 1 || !strings.Contains(got, "user=app") || !strings.Contains(got, "nats://relay:xxxxx@") {
		t.Errorf("log should say the reason once, credentials scrubbed:\n%s", got)
	}
	if strings.Contains(got, "s3cret") {
		t.Errorf("log holds a credential:\n%s", got)
	}

	// A client that connects and sends nothing is closed within the read
	// header timeout rather than held for good.
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read = %v, want EOF (closed by the server)", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestScrubCredentials(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"dial nats://u:pw@h:4222 failed":         "dial nats://u:xxxxx@h:4222 failed",
		"postgres://app:p%40ss@db/x?sslmode=x":   "postgres://app:xxxxx@db/x?sslmode=x",
		"host=db password=s3cret user=app":       "host=db password=xxxxx user=app",
		"host=db password = s3cret user=app":     "host=db password = xxxxx user=app",
		"password='two words' user=app":          "password=xxxxx user=app",
		"token=abc":                              "token=xxxxx",
		"no credential at user=app host=db:5432": "no credential at user=app host=db:5432",
	} {
		if got := telemetry.ScrubCredentials(in); got != want {
			t.Errorf("ScrubCredentials(%q) = %q, want %q", in, got, want)
		}
	}
}
