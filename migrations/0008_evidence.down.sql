-- Roll back binaries, not schema (docs/operations.md): this undoes 0008 for
-- a database whose rows never reached delivered or undelivered.
REVOKE ALL ON sms_evidence FROM sendonce_receiver, sendonce_sender, sendonce_relay;
DROP TABLE IF EXISTS sms_evidence;
CREATE INDEX IF NOT EXISTS sms_outbox_finished_idx ON sms_outbox (updated_at) WHERE status IN ('sent', 'dead', 'unknown');
DROP INDEX IF EXISTS sms_outbox_purgeable_idx;
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS lookup_pending, DROP COLUMN IF EXISTS lookups;
ALTER TABLE sms_outbox DROP CONSTRAINT IF EXISTS sms_outbox_status_valid,
    ADD CONSTRAINT sms_outbox_status_valid CHECK (status IN ('pending', 'queued', 'sending', 'sent', 'dead', 'unknown'));
ALTER TABLE sms_attempts DROP CONSTRAINT IF EXISTS sms_attempts_outcome_check,
    ADD CONSTRAINT sms_attempts_outcome_check CHECK (outcome IN ('sent', 'retry', 'rate_limited', 'permanent', 'ambiguous', 'max_attempts')) NOT VALID;
