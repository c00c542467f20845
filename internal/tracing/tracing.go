// Package tracing follows one message from the application's span to the
// provider's HTTP request with OpenTelemetry: the row's traceparent (W3C
// Trace Context, written by outbox.Enqueue or any INSERT) travels in the
// NATS message's headers, and the relay and the senders make their spans
// in that trace. It is off unless the standard OTEL_* variables configure
// an OTLP endpoint; off, every function here is a nil check.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Header is the W3C Trace Context header, in NATS messages as in HTTP.
const Header = "traceparent"

// MessagingSystem is messaging.system for spans about NATS messages.
var MessagingSystem = semconv.MessagingSystemKey.String("nats")

// Tracing is the process's tracer and its exporter. A nil *Tracing is
// tracing turned off: every method is then a no-op.
type Tracing struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// propagator reads and writes traceparent (and tracestate).
var propagator = propagation.TraceContext{}

// Enabled reports whether the OTEL_* variables ask for traces: an OTLP
// endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or its traces-only form),
// the SDK is not disabled, and the traces exporter is otlp (or unset).
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e != "" && e != "otlp" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Start makes the tracer of service (the default service.name, which
// OTEL_SERVICE_NAME overrides) when Enabled, exporting over OTLP/HTTP as
// the OTEL_EXPORTER_OTLP_* variables say; nil, nil when not. A protocol
// other than http/protobuf is refused, naming the setting.
func Start(ctx context.Context, service, version string, getenv func(string) string) (*Tracing, error) {
	if !Enabled(getenv) {
		return nil, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(getenv(k)); p != "" {
			if p != "http/protobuf" {
				return nil, fmt.Errorf("%s: %q is not served: set http/protobuf (OTLP over HTTP), the only protocol sendonce exports with", k, p)
			}
			break
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %w", err)
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(service)}
	if version != "" {
		attrs = append(attrs, semconv.ServiceVersion(version))
	}
	// The environment's attributes (OTEL_SERVICE_NAME,
	// OTEL_RESOURCE_ATTRIBUTES) win over the defaults.
	res, err := resource.Merge(resource.NewWithAttributes(semconv.SchemaURL, attrs...), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return New(sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))), nil
}

// New is tracing through tp, a provider the caller made (a test's, with
// an in-memory recorder).
func New(tp *sdktrace.TracerProvider) *Tracing {
	return &Tracing{provider: tp, tracer: tp.Tracer("github.com/sendonce/sendonce")}
}

// Shutdown exports the spans still buffered and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Tracer is the process's tracer; nil when tracing is off.
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}

// Parse reads a traceparent value into a remote span context; false for
// an empty or malformed one, which is ignored (a trace is never a reason
// to refuse a message).
func Parse(traceparent string) (trace.SpanContext, bool) {
	if traceparent == "" {
		return trace.SpanContext{}, false
	}
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier{Header: traceparent}))
	return sc, sc.IsValid()
}

// Format is the traceparent of the span in ctx; "" when ctx has none.
func Format(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c[Header]
}

// Continue returns ctx under the remote span traceparent names; ctx as it
// is when traceparent does not parse.
func Continue(ctx context.Context, traceparent string) (context.Context, bool) {
	sc, ok := Parse(traceparent)
	if !ok {
		return ctx, false
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), true
}

// TraceID is the trace id of the span in ctx, for logs; "" when none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// Child records a finished span named name under parent (a context
// holding a span), from start to end: the work of a batch (a claim, a
// status write) seen from each traced message it carried.
func (t *Tracing) Child(parent context.Context, name string, kind trace.SpanKind, start, end time.Time, err error, attrs ...attribute.KeyValue) {
	if t == nil || !trace.SpanContextFromContext(parent).IsValid() {
		return
	}
	_, span := t.tracer.Start(parent, name, trace.WithSpanKind(kind), trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(fmt.Sprintf("%T", err)))
	}
	span.End(trace.WithTimestamp(end))
}

// Transport makes a client span for each request sent in a traced context
// and sends its traceparent with the request, so that the provider's own
// tracing (where it has one) joins the trace. Requests in an untraced
// context pass as they are.
func (t *Tracing) Transport(next http.RoundTripper) http.RoundTripper {
	if t == nil {
		return next
	}
	return &transport{t: t, next: next}
}

type transport struct {
	t    *Tracing
	next http.RoundTripper
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return tr.next.RoundTrip(req)
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.ServerAddress(req.URL.Hostname()),
		// The path and no query: a lookup's query names the message.
		semconv.URLFull(req.URL.Scheme + "://" + req.URL.Host + req.URL.EscapedPath()),
	}
	if p, err := strconv.Atoi(req.URL.Port()); err == nil {
		attrs = append(attrs, semconv.ServerPort(p))
	}
	ctx, span := tr.t.tracer.Start(ctx, req.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	// A RoundTripper must not change the request it is given.
	out := req.Clone(ctx)
	propagator.Inject(ctx, propagation.HeaderCarrier(out.Header))
	resp, err := tr.next.RoundTrip(out)
	if err != nil {
		span.SetStatus(codes.Error, "request failed")
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		return resp, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, "")
		span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
	}
	return resp, nil
}

// errorType is error.type for a failed request: a timeout, or the
// error's type.
func errorType(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	var to interface{ Timeout() bool }
	if errors.As(err, &to) && to.Timeout() {
		return "timeout"
	}
	return fmt.Sprintf("%T", err)
}
