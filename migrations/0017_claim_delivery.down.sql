ALTER TABLE sms_outbox DROP COLUMN IF EXISTS claim_delivery;
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS claim_seq;
