-- sendonce:no-transaction
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM sms_outbox WHERE status IN ('scheduled', 'expired', 'cancelled', 'suppressed')) THEN
        RAISE EXCEPTION 'sms_outbox holds scheduled, expired, cancelled or suppressed rows, which the schema before 0030 cannot hold: finish or purge them first';
    END IF;
END $$;
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_unsent_idx;
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_expiring_idx;
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_scheduled_idx;
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_idempotency_key;
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS expires_at, DROP COLUMN IF EXISTS send_at, DROP COLUMN IF EXISTS idempotency_key;
DELETE FROM sms_attempts WHERE outcome = 'expired';
ALTER TABLE sms_attempts DROP CONSTRAINT IF EXISTS sms_attempts_outcome_check;
ALTER TABLE sms_attempts ADD CONSTRAINT sms_attempts_outcome_check CHECK (outcome IN (
    'sent', 'retry', 'rate_limited', 'lookup', 'permanent', 'ambiguous', 'max_attempts'));
ALTER TABLE sms_outbox DROP CONSTRAINT IF EXISTS sms_outbox_status_valid;
ALTER TABLE sms_outbox ADD CONSTRAINT sms_outbox_status_valid CHECK (status IN (
    'pending', 'queued', 'sending', 'sent', 'delivered', 'undelivered', 'dead', 'unknown'));
