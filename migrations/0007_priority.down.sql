DROP INDEX IF EXISTS sms_outbox_urgent_open_idx;
ALTER TABLE sms_attempts DROP CONSTRAINT IF EXISTS sms_attempts_outcome_check;
ALTER TABLE sms_attempts ADD CONSTRAINT sms_attempts_outcome_check
    CHECK (outcome IN ('sent', 'retry', 'permanent', 'ambiguous', 'max_attempts')) NOT VALID;
CREATE INDEX IF NOT EXISTS sms_outbox_pending_idx ON sms_outbox (created_at) WHERE status = 'pending';
DROP INDEX IF EXISTS sms_outbox_pending_priority_idx;
CREATE OR REPLACE FUNCTION sms_outbox_immutable_intent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.to_e164 IS DISTINCT FROM OLD.to_e164
       OR NEW.body IS DISTINCT FROM OLD.body THEN
        RAISE EXCEPTION 'sms_outbox: id, to_e164 and body are immutable (insert a new row instead)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
DROP TRIGGER IF EXISTS sms_outbox_immutable_intent ON sms_outbox;
CREATE TRIGGER sms_outbox_immutable_intent
    BEFORE UPDATE OF id, to_e164, body ON sms_outbox
    FOR EACH ROW EXECUTE FUNCTION sms_outbox_immutable_intent();
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS priority;
