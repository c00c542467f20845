package sender

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/tracing"
)

// claimResults name a claim's results in its span.
var claimResults = map[outbox.ClaimResult]string{
	outbox.Claimed: "claimed", outbox.ClaimedStale: "claimed_stale", outbox.AlreadyTerminal: "already_terminal",
	outbox.Leased: "leased", outbox.NotFound: "not_found", outbox.Expired: "expired", outbox.Suppressed: "suppressed",
}

// startTrace begins the span of h's processing in the trace its
// traceparent header continues (the relay's publication span), when
// tracing is on and the header parses.
func (s *Sender) startTrace(h *held) {
	if s.cfg.Tracing == nil {
		return
	}
	ctx, ok := tracing.Continue(context.Background(), h.msg.Headers().Get(tracing.Header))
	if !ok {
		return
	}
	attrs := []otelattr.KeyValue{tracing.MessagingSystem, semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"), semconv.MessagingDestinationName(h.msg.Subject())}
	if h.md != nil {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(h.md.Consumer))
	}
	_, h.trace = s.cfg.Tracing.Tracer().Start(ctx, "process "+h.msg.Subject(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...))
}

// traced is ctx under h's processing span; ctx as it is for an untraced
// message.
func (h held) traced(ctx context.Context) context.Context {
	if h.trace == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, h.trace)
}

// step records a finished span of the batch work that carried h (its
// claim, its status write) under h's processing span.
func (s *Sender) step(h held, name, operation string, start, end time.Time, err error, attrs ...otelattr.KeyValue) {
	if h.trace == nil {
		return
	}
	attrs = append(attrs, semconv.DBSystemNamePostgreSQL, semconv.DBOperationName(operation), semconv.DBCollectionName("sms_outbox"))
	s.cfg.Tracing.Child(h.traced(context.Background()), name, trace.SpanKindClient, start, end, err, attrs...)
}

// endTrace ends h's processing span with what became of the message.
func (h held) endTrace(outcome string, failed bool) {
	if h.trace == nil {
		return
	}
	h.trace.SetAttributes(otelattr.String("sendonce.outcome", outcome))
	if failed {
		h.trace.SetStatus(codes.Error, outcome)
	}
	h.trace.End()
}

// traceWrites records the status write of each traced message of batch and
// ends its processing span with the status written (or why none was).
func (s *Sender) traceWrites(batch []result, written map[uuid.UUID]outbox.Written, ok bool, start, end time.Time) {
	for _, r := range batch {
		if r.trace == nil {
			continue
		}
		_, applied := written[r.row.ID]
		switch {
		case !ok:
			s.step(r.held, "UPDATE sms_outbox", "UPDATE", start, end, errWriteAbandoned)
			r.endTrace("status write abandoned at shutdown: redelivered", true)
		case r.row.Status == "":
			r.endTrace("nothing written", false)
		default:
			s.step(r.held, "UPDATE sms_outbox", "UPDATE", start, end, nil,
				otelattr.String("sendonce.status", string(r.row.Status)), otelattr.Bool("sendonce.applied", applied))
			r.endTrace(string(r.row.Status), r.row.Status == outbox.StatusDead || r.row.Status == outbox.StatusUnknown)
		}
	}
}

// errWriteAbandoned is a status write given up at the shutdown timeout.
var errWriteAbandoned = errors.New("status write still failing at the shutdown timeout")
