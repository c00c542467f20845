-- sendonce:no-transaction
-- Claims, leases and dead letters recorded in the row, so that a sender that
-- loses an answer, or a process that dies, leaves facts behind, not guesses.

-- claim_id: the token of the claim that holds the row (or held it last). A
-- sender mints one per claim statement and writes it with the claim, so that
-- a claim whose answer was lost can be run again and find its own rows
-- (instead of reading them as "another sender died mid-call"), and so that
-- every retry, dead or unknown write is fenced on the claim that decided it.
-- lease_until: when the holding claim's lease ends, stamped by the database
-- clock; the reconciler and other claimants read it, so no process needs to
-- know another's lease setting.
-- end_reason: the dead-letter reason of a dead or unknown row (permanent,
-- max_attempts, ambiguous, invalid), so a replay by reason acts only on rows
-- whose current state the letter describes.
-- letter_seq: the SMS_DLQ sequence of the row's dead letter; NULL on a dead
-- or unknown row means the letter is still to be published (the reconciler
-- publishes any a process died before publishing).
--
-- This file runs outside a transaction, one statement at a time: in one
-- transaction, the UPDATE and the index build below ran under the ALTER
-- TABLE's ACCESS EXCLUSIVE lock, stopping every insert for as long as they
-- scanned the table (on 1,000,000 rows, inserts waited over 750 ms:
-- TestLiveMigrationOfAMillionRows). Every statement is safe to run again.
-- Databases that applied the earlier, transactional form of this file end in
-- the same state and never run it again (migrations are recorded by version).
ALTER TABLE sms_outbox
    ADD COLUMN IF NOT EXISTS claim_id    uuid,
    ADD COLUMN IF NOT EXISTS lease_until timestamptz,
    ADD COLUMN IF NOT EXISTS end_reason  text,
    ADD COLUMN IF NOT EXISTS letter_seq  bigint;

-- end_reason's check in two steps: added NOT VALID (no scan under the
-- ALTER's lock; new writes are checked at once), then validated under a
-- lock that lets writes go on.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_end_reason_valid') THEN
        ALTER TABLE sms_outbox ADD CONSTRAINT sms_outbox_end_reason_valid
            CHECK (end_reason IN ('permanent', 'max_attempts', 'ambiguous', 'invalid')) NOT VALID;
    END IF;
END $$;
ALTER TABLE sms_outbox VALIDATE CONSTRAINT sms_outbox_end_reason_valid;

-- Rows finished before this migration had their letters published first.
-- Row locks only (no lock that stops inserts); a second run leaves the rows
-- the first one set.
UPDATE sms_outbox
SET letter_seq = 0,
    end_reason = CASE
        WHEN status = 'unknown' THEN 'ambiguous'
        WHEN last_error LIKE 'attempts exhausted%' THEN 'max_attempts'
        ELSE 'permanent' END
WHERE status IN ('dead', 'unknown') AND letter_seq IS NULL;

-- Serves the reconciler's search for letters still to publish: almost always
-- empty. Built concurrently; a build that failed part-way leaves an invalid
-- index of this name, dropped first.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_unlettered_idx;
CREATE INDEX CONCURRENTLY sms_outbox_unlettered_idx ON sms_outbox (updated_at)
    WHERE status IN ('dead', 'unknown') AND letter_seq IS NULL;

GRANT SELECT (claim_id, lease_until, end_reason, letter_seq),
      UPDATE (claim_id, lease_until, end_reason, letter_seq, stream_seq)
    ON sms_outbox TO sendonce_sender;
GRANT SELECT (lease_until, end_reason, letter_seq),
      UPDATE (end_reason, letter_seq)
    ON sms_outbox TO sendonce_relay;
GRANT SELECT (stream_seq) ON sms_outbox TO sendonce_sender;
-- The status write keeps a row's provider_ref unless it writes sent, and a
-- status write tried again after a lost commit looks for the attempts it
-- logged already.
GRANT SELECT (provider_ref) ON sms_outbox TO sendonce_sender;
GRANT SELECT (outbox_id, attempt, started_at) ON sms_attempts TO sendonce_sender;
-- An operator replay (relay dlq replay) clears the row's claim.
GRANT UPDATE (claim_id, lease_until) ON sms_outbox TO sendonce_relay;
