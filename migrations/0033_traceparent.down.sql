-- Back to 0032: no trace context in the rows.
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS traceparent;
