ALTER TABLE sms_attempts DROP COLUMN IF EXISTS provider;
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS provider;
