-- The role stays: it is cluster-wide and other databases may use it.
CREATE INDEX IF NOT EXISTS sms_outbox_purgeable_idx ON sms_outbox (updated_at)
    WHERE status IN ('sent', 'delivered', 'undelivered', 'dead');
DROP INDEX IF EXISTS sms_outbox_final_idx;
DROP INDEX IF EXISTS sms_attempts_started_idx;
DROP INDEX IF EXISTS sms_outbox_dead_idx;
DROP TABLE IF EXISTS sendonce_console_audit;
DROP VIEW IF EXISTS sms_outbox_masked;
REVOKE ALL ON sms_outbox, sms_attempts, sms_evidence FROM sendonce_console;
