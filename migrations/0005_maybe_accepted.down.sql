ALTER TABLE sms_outbox DROP COLUMN IF EXISTS maybe_accepted;
