DROP TABLE IF EXISTS sms_attempts;
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS stream_seq;
