-- sendonce:no-transaction
-- Flow control: a priority per message, part of its immutable intent.
-- 1 urgent (one-time codes), 2 normal (the default), 3 bulk (campaigns).
-- This file runs outside a transaction, one statement at a time, so that no
-- statement blocks inserts for longer than a catalog change; every
-- statement is safe to run again.

-- A constant default makes the column a catalog-only change.
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 2;

-- Its check in two steps: NOT VALID (no scan under the ALTER's lock), then
-- validated under a lock that lets writes go on.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_priority_valid') THEN
        ALTER TABLE sms_outbox ADD CONSTRAINT sms_outbox_priority_valid CHECK (priority BETWEEN 1 AND 3) NOT VALID;
    END IF;
END $$;
ALTER TABLE sms_outbox VALIDATE CONSTRAINT sms_outbox_priority_valid;

-- The relay claims urgent rows first: its claim reads this index in order.
-- Built concurrently; a build that failed part-way leaves an invalid index
-- of the name, dropped first.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_pending_priority_idx;
CREATE INDEX CONCURRENTLY sms_outbox_pending_priority_idx ON sms_outbox (priority, created_at) WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_pending_idx;

-- The age of the oldest unsent urgent message, for its alert, without a scan
-- of a bulk backlog: only urgent rows in flight are in this index.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_urgent_open_idx;
CREATE INDEX CONCURRENTLY sms_outbox_urgent_open_idx ON sms_outbox (created_at)
    WHERE priority = 1 AND status IN ('pending', 'queued', 'sending');

-- I4 covers the priority too: changing it would be another message.
CREATE OR REPLACE FUNCTION sms_outbox_immutable_intent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.to_e164 IS DISTINCT FROM OLD.to_e164
       OR NEW.body IS DISTINCT FROM OLD.body
       OR NEW.priority IS DISTINCT FROM OLD.priority THEN
        RAISE EXCEPTION 'sms_outbox: id, to_e164, body and priority are immutable (insert a new row instead)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE OR REPLACE TRIGGER sms_outbox_immutable_intent
    BEFORE UPDATE OF id, to_e164, body, priority ON sms_outbox
    FOR EACH ROW EXECUTE FUNCTION sms_outbox_immutable_intent();

-- A 429 is not an attempt (the provider took nothing, and asks to slow
-- down): the attempts log records it as rate_limited, and the row gets its
-- attempt back. One statement swaps the check (no moment without one); it
-- is validated after, under a lock that lets inserts go on.
ALTER TABLE sms_attempts
    DROP CONSTRAINT IF EXISTS sms_attempts_outcome_check,
    ADD CONSTRAINT sms_attempts_outcome_check
        CHECK (outcome IN ('sent', 'retry', 'rate_limited', 'permanent', 'ambiguous', 'max_attempts')) NOT VALID;
ALTER TABLE sms_attempts VALIDATE CONSTRAINT sms_attempts_outcome_check;

GRANT INSERT (priority) ON sms_outbox TO sendonce_app;
GRANT SELECT (priority) ON sms_outbox TO sendonce_app, sendonce_relay, sendonce_sender;
