package service_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/tracing"
)

// RunTraced hands run no traces when the OTEL_* variables ask for none,
// and makes run's result the exit code; a run that fails, or traces that
// cannot start, are logged as the command's failure, and then run is not
// called at all.
func TestRunTraced(t *testing.T) {
	t.Parallel()
	off := testkit.EnvMap(nil)
	badProtocol := testkit.EnvMap(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
	})
	for _, tt := range []struct {
		name      string
		getenv    func(string) string
		runErr    error
		wantCode  int
		wantCalls int
		wantLog   string // a line logged, "" for none
	}{
		{"off, ok", off, nil, 0, 1, ""},
		{"off, run fails", off, errors.New("boom"), 1, 1, "relay failed"},
		{"tracing cannot start", badProtocol, nil, 1, 0, "relay failed"},
	} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		calls := 0
		code := service.RunTraced(context.Background(), "sendonce-relay", "relay", tt.getenv, log, func(tr *tracing.Tracing) error {
			calls++
			if tr != nil {
				t.Errorf("%s: run got traces, want none", tt.name)
			}
			return tt.runErr
		})
		if code != tt.wantCode || calls != tt.wantCalls {
			t.Errorf("%s: exit %d after %d calls of run, want %d after %d", tt.name, code, calls, tt.wantCode, tt.wantCalls)
		}
		if got := buf.String(); tt.wantLog == "" && strings.Contains(got, "failed") || tt.wantLog != "" && !strings.Contains(got, "msg=\""+tt.wantLog+"\"") {
			t.Errorf("%s: logged %q, want %q", tt.name, got, tt.wantLog)
		}
	}
}
