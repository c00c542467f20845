-- sendonce:no-transaction
-- Evidence: delivery receipts and provider lookups settle what sendonce
-- would otherwise have to guess. This file runs outside a transaction, one
-- statement at a time (nothing blocks inserts for longer than a catalog
-- change); every statement is safe to run again.

-- The statuses delivered and undelivered, from receipts (or a lookup). The
-- check is swapped in one statement (never a moment without one) and
-- validated after, under a lock that lets writes go on.
ALTER TABLE sms_outbox
    DROP CONSTRAINT IF EXISTS sms_outbox_status_valid,
    ADD CONSTRAINT sms_outbox_status_valid
        CHECK (status IN ('pending', 'queued', 'sending', 'sent', 'delivered', 'undelivered', 'dead', 'unknown')) NOT VALID;
ALTER TABLE sms_outbox VALIDATE CONSTRAINT sms_outbox_status_valid;

-- lookup_pending: the row's last attempt, at a provider without
-- idempotency, ended without an answer; before anything else is sent, the
-- provider is asked whether it has the message (by its reference, the row
-- id). lookups counts the lookups that failed, against a budget.
ALTER TABLE sms_outbox
    ADD COLUMN IF NOT EXISTS lookup_pending boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS lookups smallint NOT NULL DEFAULT 0;

-- Every receipt and every lookup answer, for the trace and the console.
-- Never the number or the body.
CREATE TABLE IF NOT EXISTS sms_evidence (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id    uuid        NOT NULL REFERENCES sms_outbox (id) ON DELETE CASCADE,
    kind         text        NOT NULL CHECK (kind IN ('receipt', 'lookup')),
    -- receipts: delivered, undelivered, accepted; lookups: found, none,
    -- several, failed.
    result       text        NOT NULL,
    provider_ref text,
    code         integer,
    detail       text,
    -- When the provider says it happened (receipts), if it says.
    reported_at  timestamptz,
    received_at  timestamptz NOT NULL DEFAULT now(),
    -- Who brought it: generic or twilio (receipts), sender or resolve
    -- (lookups).
    source       text        NOT NULL
);
CREATE INDEX IF NOT EXISTS sms_evidence_outbox_idx ON sms_evidence (outbox_id, id);

-- Retention purges every final status but unknown (which waits for a
-- person or for evidence): the partial index follows the new statuses.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_purgeable_idx;
CREATE INDEX CONCURRENTLY sms_outbox_purgeable_idx ON sms_outbox (updated_at)
    WHERE status IN ('sent', 'delivered', 'undelivered', 'dead');
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_finished_idx;

-- A lookup is a step of an attempt, recorded in the attempts log.
ALTER TABLE sms_attempts
    DROP CONSTRAINT IF EXISTS sms_attempts_outcome_check,
    ADD CONSTRAINT sms_attempts_outcome_check
        CHECK (outcome IN ('sent', 'retry', 'rate_limited', 'lookup', 'permanent', 'ambiguous', 'max_attempts')) NOT VALID;
ALTER TABLE sms_attempts VALIDATE CONSTRAINT sms_attempts_outcome_check;

-- The receiver: reads and moves the status of rows it gets receipts for,
-- records the receipts; never the number or the body.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sendonce_receiver') THEN
        CREATE ROLE sendonce_receiver NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'role sendonce_receiver is missing and % may not create it: an administrator creates the roles once (docs/operations.md, managed Postgres)', current_user
        USING ERRCODE = 'insufficient_privilege';
END $$;
GRANT SELECT (id, status, provider_ref) ON sms_outbox TO sendonce_receiver;
GRANT UPDATE (status, provider_ref, lookup_pending, updated_at) ON sms_outbox TO sendonce_receiver;
GRANT SELECT (outbox_id, kind, result, provider_ref, code, reported_at, source), INSERT ON sms_evidence TO sendonce_receiver;
GRANT SELECT ON sendonce_schema_migrations TO sendonce_receiver;

-- The senders: lookups before a retry.
GRANT SELECT (lookup_pending, lookups), UPDATE (lookup_pending, lookups) ON sms_outbox TO sendonce_sender;
GRANT SELECT (outbox_id, kind, received_at), INSERT ON sms_evidence TO sendonce_sender;

-- The relay: relay resolve (lookups of unknown rows, by reference: never
-- the number or the body) and relay trace.
GRANT SELECT (lookup_pending, lookups), UPDATE (provider_ref, lookup_pending, lookups, maybe_accepted) ON sms_outbox TO sendonce_relay;
GRANT SELECT, INSERT ON sms_evidence TO sendonce_relay;

-- Applications read the new statuses like the others.
GRANT SELECT (id, status) ON sms_outbox TO sendonce_app;
