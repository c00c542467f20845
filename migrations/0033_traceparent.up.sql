-- The trace a message belongs to (docs/observability.md).
--
-- traceparent is the W3C Trace Context header of the application's span
-- that enqueued the row ("00-<trace id>-<span id>-<flags>"), written by
-- outbox.Enqueue from the caller's context or by any language's INSERT.
-- The relay carries it in the message's NATS headers and the senders
-- continue that trace to the provider's HTTP request. NULL: no trace.
--
-- No CHECK: a malformed value must not fail the application's
-- transaction for the sake of a trace; the relay forwards only a value
-- that parses, and ignores any other.
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS traceparent text;

GRANT INSERT (traceparent) ON sms_outbox TO sendonce_app;
GRANT SELECT (traceparent) ON sms_outbox TO sendonce_relay, sendonce_receiver, sendonce_console;
