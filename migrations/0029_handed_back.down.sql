ALTER TABLE sms_outbox DROP COLUMN IF EXISTS handback_delivery;
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS handback_seq;
