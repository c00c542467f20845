-- sendonce:no-transaction
-- The operator console (relay console): a role with only what its pages read
-- and its replays write, a view that shows numbers masked, the audit of its
-- replays, and the indexes that keep its overview cheap on a large table.
-- This file runs outside a transaction, one statement at a time, so that the
-- index builds go on concurrently with the applications' writes. Every
-- statement is safe to run again.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sendonce_console') THEN
        CREATE ROLE sendonce_console NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'role sendonce_console is missing and % may not create it: an administrator creates the roles once (docs/operations.md, managed Postgres)', current_user
        USING ERRCODE = 'insufficient_privilege';
END $$;

-- Every column but the number and the body: the pages show statuses,
-- attempts, claims and dead-letter facts.
GRANT SELECT (id, status, attempt_count, max_attempts, publish_gen, stream_seq, next_attempt_at,
              last_error, provider_ref, created_at, updated_at, maybe_accepted, claim_id,
              lease_until, end_reason, letter_seq, priority)
    ON sms_outbox TO sendonce_console;
-- What a replay (outbox.Replay) writes.
GRANT UPDATE (status, publish_gen, attempt_count, next_attempt_at, updated_at, stream_seq,
              claim_id, lease_until, end_reason, letter_seq, last_error)
    ON sms_outbox TO sendonce_console;
GRANT SELECT ON sms_attempts TO sendonce_console;
GRANT SELECT ON sendonce_schema_migrations TO sendonce_console;
-- A message's receipts and lookups (migration 0008) and whether a lookup is
-- due, for its timeline. sms_evidence holds neither the number nor the
-- body; its columns are named so that a column added later is not read
-- before someone decides it may be.
GRANT SELECT (lookup_pending, lookups) ON sms_outbox TO sendonce_console;
GRANT SELECT (id, outbox_id, kind, result, provider_ref, code, detail, reported_at, received_at, source)
    ON sms_evidence TO sendonce_console;

-- The number as the logs show it (outbox.MaskPhone: "+1*******67") and the
-- body's length. A view runs with its owner's rights, so the console role
-- reads masked numbers without any right on to_e164 or body.
CREATE OR REPLACE VIEW sms_outbox_masked AS
SELECT id,
       CASE WHEN length(to_e164) < 5 THEN '+***'
            ELSE left(to_e164, 2) || repeat('*', length(to_e164) - 4) || right(to_e164, 2)
       END AS to_masked,
       char_length(body) AS body_chars
FROM sms_outbox;
GRANT SELECT ON sms_outbox_masked TO sendonce_console;

-- One row per replay made from the console: who, when, what was asked and
-- what was done. The console may add rows and read them, never change them.
CREATE TABLE IF NOT EXISTS sendonce_console_audit (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    username  text        NOT NULL,
    role      text        NOT NULL,
    action    text        NOT NULL,
    requested uuid[]      NOT NULL,
    replayed  uuid[]      NOT NULL,
    refused   integer     NOT NULL,
    remote    text
);
CREATE INDEX IF NOT EXISTS sendonce_console_audit_replayed_idx ON sendonce_console_audit USING gin (replayed);
GRANT SELECT, INSERT ON sendonce_console_audit TO sendonce_console;

-- Dead and unknown rows, newest change first: the dead-letters page, the
-- overview's counts of them and its dead letters per hour by reason. Rows
-- in these statuses are few, so the index is small and only rows entering
-- them pay for it. Built concurrently; a build that failed part-way leaves
-- an invalid index of this name, dropped first.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_dead_idx;
CREATE INDEX CONCURRENTLY sms_outbox_dead_idx ON sms_outbox (updated_at) INCLUDE (status, end_reason)
    WHERE status IN ('dead', 'unknown');

-- Attempts by start time: the overview's sends per second and its chart of
-- the last hour. Attempts are appended in time order, so the insert lands on
-- the index's rightmost page.
DROP INDEX CONCURRENTLY IF EXISTS sms_attempts_started_idx;
CREATE INDEX CONCURRENTLY sms_attempts_started_idx ON sms_attempts (started_at) INCLUDE (outcome);

-- Final rows (sent, delivered, undelivered, dead) by their last change,
-- with their status: the overview counts each final status of the last
-- hour and day from this index alone, and retention (outbox.Purge and the
-- oldest purgeable age) reads it as it read sms_outbox_purgeable_idx of
-- migration 0008, which it replaces: same key, same predicate, the status
-- carried beside the key. Replacing rather than adding keeps one index
-- entry per finished row. The new index is built before the old one goes,
-- so retention always has one.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_final_idx;
CREATE INDEX CONCURRENTLY sms_outbox_final_idx ON sms_outbox (updated_at) INCLUDE (status)
    WHERE status IN ('sent', 'delivered', 'undelivered', 'dead');
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_purgeable_idx;
