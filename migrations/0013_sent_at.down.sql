-- Dropping the column drops its column grants with it.
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS sent_at;
