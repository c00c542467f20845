package telemetry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
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
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "postgres") {
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
