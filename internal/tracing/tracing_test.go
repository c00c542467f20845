package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestEnabled(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
	} {
		if got := Enabled(env(tt.env)); got != tt.want {
			t.Errorf("Enabled(%v) = %v, want %v", tt.env, got, tt.want)
		}
	}
}

func TestStartRefusesAnotherProtocol(t *testing.T) {
	tr, err := Start(context.Background(), "sendonce-test", "", env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}))
	if err == nil || tr != nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("Start with grpc = %v, %v; want an error naming OTEL_EXPORTER_OTLP_PROTOCOL", tr, err)
	}
	if tr, err := Start(context.Background(), "sendonce-test", "", env(nil)); tr != nil || err != nil {
		t.Fatalf("Start without an endpoint = %v, %v; want off", tr, err)
	}
}

func TestParseAndFormat(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx, ok := Continue(context.Background(), tp)
	if !ok || Format(ctx) != tp || TraceID(ctx) != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("Continue(%s): ok %v, Format %q, TraceID %q", tp, ok, Format(ctx), TraceID(ctx))
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) took a malformed value", bad)
		}
	}
	if Format(context.Background()) != "" || TraceID(context.Background()) != "" {
		t.Error("an untraced context formats as a trace")
	}
}

// The transport makes a client span for a traced request and sends its
// traceparent; an untraced request passes as it is; a nil *Tracing is off.
func TestTransport(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get(Header))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := &Tracing{provider: tp, tracer: tp.Tracer("test")}
	client := &http.Client{Transport: tr.Transport(http.DefaultTransport)}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	for _, c := range []context.Context{ctx, context.Background()} {
		req, _ := http.NewRequestWithContext(c, http.MethodPost, srv.URL+"/v1/messages?reference=secret", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if req.Header.Get(Header) != "" {
			t.Fatal("the transport changed the caller's request")
		}
	}
	parent.End()
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != "POST" || spans[0].SpanKind() != trace.SpanKindClient || spans[0].Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("spans = %v, want a POST client span under the parent, then the parent", spans)
	}
	want := "00-" + parent.SpanContext().TraceID().String() + "-" + spans[0].SpanContext().SpanID().String() + "-01"
	if len(got) != 2 || got[0] != want || got[1] != "" {
		t.Fatalf("traceparents sent: %q, want %q then none", got, want)
	}
	for _, kv := range spans[0].Attributes() {
		if strings.Contains(kv.Value.Emit(), "secret") {
			t.Errorf("attribute %s holds the query: %s", kv.Key, kv.Value.Emit())
		}
	}
	var off *Tracing
	if off.Transport(http.DefaultTransport) != http.DefaultTransport || off.Tracer() != nil || off.Shutdown(context.Background()) != nil {
		t.Error("a nil Tracing is not off")
	}
}
