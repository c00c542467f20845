package e2e

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/tracing"
	"github.com/sendonce/sendonce/outbox"
)

// otlpSpan is one span an OTLP receiver got, with its service.
type otlpSpan struct {
	service string
	span    *tracepb.Span
}

// otlpReceiver is an OTLP/HTTP trace receiver on a real socket: it decodes
// each export with the protocol's published protobuf types.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
	url   string
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("OTLP receiver: %s %s (%s), want POST /v1/traces of application/x-protobuf", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
			http.Error(w, "unexpected", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(req.Body)
		var export coltrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &export)
		}
		if err != nil {
			t.Errorf("OTLP receiver: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			service := attr(rs.GetResource().GetAttributes(), "service.name")
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					r.spans = append(r.spans, otlpSpan{service: service, span: sp})
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *otlpReceiver) all() []otlpSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]otlpSpan(nil), r.spans...)
}

// attr is the string value of attribute key, "" when absent.
func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// One message enqueued inside an application's span is followed to the
// provider's HTTP request: the relay's publication, the sender's
// processing, its claim, its provider request and its status write are
// spans of the application's trace, each under the one before, exported
// over OTLP/HTTP by the real binaries; the provider receives the trace's
// traceparent; no span holds the number or the body.
func TestOneMessageOneTraceFromTheAppToTheProvider(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	rec := startOTLPReceiver(t)

	// The provider: the stub, behind a proxy that keeps each request's
	// traceparent.
	stub, err := url.Parse(e.stubURL)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		parents []string
	)
	proxy := httputil.NewSingleHostReverseProxy(stub)
	prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		parents = append(parents, req.Header.Get("traceparent"))
		mu.Unlock()
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(prov.Close)

	// The application traces with the SDK too, to the same receiver.
	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(rec.url+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	appCtx, app := tp.Tracer("app").Start(ctx, "POST /signup")
	const phone, body = "+15551230777", "your code is 424242"
	var traced, untraced uuid.UUID
	if err := pgx.BeginFunc(appCtx, e.pool, func(tx pgx.Tx) error {
		var err error
		if traced, err = outbox.Enqueue(appCtx, tx, phone, body); err != nil {
			return err
		}
		untraced, err = outbox.Enqueue(ctx, tx, "+15551230778", "no trace")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	app.End()
	appSpan := app.SpanContext()
	var stored *string
	if err := e.pool.QueryRow(ctx, `SELECT traceparent FROM sms_outbox WHERE id = $1`, untraced).Scan(&stored); err != nil || stored != nil {
		t.Fatalf("an untraced message's traceparent: %v, %v; want NULL", stored, err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT traceparent FROM sms_outbox WHERE id = $1`, traced).Scan(&stored); err != nil || stored == nil || *stored != tracing.Format(appCtx) {
		t.Fatalf("the traced message's traceparent: %v, %v; want %s", stored, err, tracing.Format(appCtx))
	}

	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rec.url, "OTEL_BSP_SCHEDULE_DELAY=100"}
	baseEnv := e.processEnv(e.dbURL())
	for i, kv := range baseEnv {
		if strings.HasPrefix(kv, "SMS_API_BASE=") {
			baseEnv[i] = "SMS_API_BASE=" + prov.URL
		}
	}
	startProcess(t, "relay", append(append([]string(nil), baseEnv...), env...))
	snd := startProcess(t, "sender", append(append([]string(nil), baseEnv...), env...))
	e.waitAllSent([]uuid.UUID{traced, untraced}, time.Minute)

	// The spans of the trace, by name, once every one has arrived.
	want := []string{"POST /signup", "send sms.send.2", "process sms.send.2", "UPDATE sms_outbox", "POST"}
	var byName map[string][]otlpSpan
	deadline := time.Now().Add(30 * time.Second)
	for {
		byName = map[string][]otlpSpan{}
		for _, s := range rec.all() {
			if [16]byte(s.span.TraceId) == appSpan.TraceID() {
				byName[s.span.Name] = append(byName[s.span.Name], s)
			}
		}
		missing := ""
		for _, n := range want {
			if len(byName[n]) == 0 {
				missing = n
			}
		}
		if len(byName["UPDATE sms_outbox"]) < 2 && missing == "" {
			missing = "the status write"
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span %q in the application's trace after 30 s; spans of the trace: %v", missing, names(byName))
		}
		time.Sleep(100 * time.Millisecond)
	}
	one := func(name string) *tracepb.Span {
		t.Helper()
		if len(byName[name]) != 1 {
			t.Fatalf("%d spans %q in the trace, want 1", len(byName[name]), name)
		}
		return byName[name][0].span
	}
	publish, process, call := one("send sms.send.2"), one("process sms.send.2"), one("POST")
	under := func(child *tracepb.Span, parent []byte, what string) {
		t.Helper()
		if string(child.ParentSpanId) != string(parent) {
			t.Errorf("%s is not under %s", child.Name, what)
		}
	}
	appID := appSpan.SpanID()
	under(publish, appID[:], "the application's span")
	under(process, publish.SpanId, "the relay's publication")
	under(call, process.SpanId, "the sender's processing")
	for _, s := range byName["UPDATE sms_outbox"] {
		under(s.span, process.SpanId, "the sender's processing")
	}
	for name, svc := range map[string]string{"send sms.send.2": "sendonce-relay", "process sms.send.2": "sendonce-sender", "POST": "sendonce-sender"} {
		if got := byName[name][0].service; got != svc {
			t.Errorf("span %q from service %q, want %q", name, got, svc)
		}
	}
	if publish.Kind != tracepb.Span_SPAN_KIND_PRODUCER || process.Kind != tracepb.Span_SPAN_KIND_CONSUMER || call.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("kinds: publish %v, process %v, call %v; want producer, consumer, client", publish.Kind, process.Kind, call.Kind)
	}
	if attr(publish.Attributes, "messaging.system") != "nats" || attr(publish.Attributes, "messaging.message.id") != traced.String() ||
		attr(call.Attributes, "http.request.method") != "POST" || attr(process.Attributes, "sendonce.outcome") != "sent" {
		t.Errorf("attributes: publish %v, call %v, process %v", publish.Attributes, call.Attributes, process.Attributes)
	}

	// The provider got the call span's traceparent for the traced message,
	// and none for the other.
	mu.Lock()
	got := append([]string(nil), parents...)
	mu.Unlock()
	wantParent := "00-" + appSpan.TraceID().String() + "-" + hex.EncodeToString(call.SpanId) + "-01"
	var seen, bare int
	for _, p := range got {
		switch p {
		case wantParent:
			seen++
		case "":
			bare++
		}
	}
	if seen != 1 || bare != len(got)-1 {
		t.Errorf("traceparents at the provider: %q; want %s once and the untraced request without", got, wantParent)
	}

	// Nothing of the message in any span, and the sender's log lines of the
	// traced message name the trace.
	for _, s := range rec.all() {
		for _, kv := range s.span.Attributes {
			if v := kv.GetValue().String(); strings.Contains(v, "5551230777") || strings.Contains(v, "424242") {
				t.Errorf("span %q attribute %s holds the number or the body", s.span.Name, kv.Key)
			}
		}
	}
	var attemptLine string
	for _, line := range strings.Split(snd.logs.String(), "\n") {
		if strings.Contains(line, `"provider attempt"`) && strings.Contains(line, traced.String()) {
			attemptLine = line
		}
	}
	if !strings.Contains(attemptLine, `"trace_id":"`+appSpan.TraceID().String()+`"`) {
		t.Errorf("the sender's line of the traced message's attempt carries no trace_id: %s", attemptLine)
	}
}

func names(byName map[string][]otlpSpan) []string {
	var out []string
	for n, ss := range byName {
		for range ss {
			out = append(out, n)
		}
	}
	return out
}

// A row the reconciler republishes (its message lost, or its retry parked
// in Postgres) goes out in its trace too: a publication span under the
// row's span, whose traceparent the republished message carries.
func TestARepublicationContinuesTheTrace(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ids := e.insert(1)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET traceparent = $2 WHERE id = $1`, ids[0], tp); err != nil {
		t.Fatal(err)
	}
	e.lose(ids)
	rec := tracetest.NewSpanRecorder()
	_, js := e.nats.Connect(t)
	r, err := relay.NewReconciler(relay.ReconcilerConfig{
		Pool: e.pool, JetStream: js, Interval: time.Hour, Grace: time.Minute, Logger: e.logger(),
		Tracing: tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))),
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Pass(context.Background()); err != nil || n != 1 {
		t.Fatalf("reconciler pass: %d rows, %v; want the lost one", n, err)
	}
	spans := rec.Ended()
	row, _ := tracing.Parse(tp)
	if len(spans) != 1 || spans[0].Parent().SpanID() != row.SpanID() || spans[0].SpanContext().TraceID() != row.TraceID() {
		t.Fatalf("spans %v, want one publication under the row's span", spans)
	}
	stream, err := js.Stream(context.Background(), streams.Stream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetLastMsgForSubject(context.Background(), "sms.send.2")
	if err != nil {
		t.Fatal(err)
	}
	want := "00-" + row.TraceID().String() + "-" + spans[0].SpanContext().SpanID().String() + "-01"
	if got := msg.Header.Get(tracing.Header); got != want {
		t.Fatalf("the republished message's traceparent %q, want %q", got, want)
	}
}
