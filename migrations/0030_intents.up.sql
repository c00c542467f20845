-- sendonce:no-transaction
-- One intent, on time, cancellable. A user sees intents and time, not
-- rows: a form posted twice must send one code, a code written before an
-- outage must not be delivered after it expired, a reminder must wait for
-- its hour, and an order cancelled must take its message back. Three
-- columns an application may write at INSERT, part of the intent like the
-- number and the body (immutable afterwards, migration 0031), and four
-- statuses:
--
--   idempotency_key  the application's own name for the intent: at most
--                    one row per key, by a unique index (a plain INSERT ...
--                    ON CONFLICT DO NOTHING with a used key writes
--                    nothing); sendonce_enqueue writes the row or returns
--                    the one the key names, refusing another number or
--                    body. A key lives as long as its row: retention
--                    purges finished rows, and their keys with them.
--   send_at          no provider call before it: a row written with a
--                    future send_at is 'scheduled', and the relay makes it
--                    'pending' once it is due. A scheduled row is in no
--                    index the pipeline reads (not the relay's pending
--                    index, not the in-flight one): a million of them cost
--                    today's traffic nothing but their own index.
--   expires_at       no provider call at or after it: a row that reaches
--                    it with no call that may have been taken ends
--                    'expired' (decided by the sender's claim and by the
--                    relay's sweep); one a call may have reached is
--                    settled by evidence, as before.
--
--   scheduled        waiting for send_at (not terminal)
--   expired          never sent: its expiry came first (final)
--   cancelled        never sent: the application took it back with
--                    sendonce_cancel before any call started (final)
--   suppressed       never sent: its number is on the suppression list
--                    (final)
--
-- A no-transaction file: each statement runs on its own and may run
-- again (IF NOT EXISTS, catalog checks), so that the index builds run
-- CONCURRENTLY and the status check is validated without a lock that
-- stops the applications' inserts; the statements that take a table lock
-- come before the index builds, so that one that times out (and makes the
-- file run again) has built nothing yet. The functions, the insert
-- trigger and the grants that let an application use the columns come in
-- 0031, in one transaction: nothing is callable, or writable by an
-- application, before it is locked down.

-- Plain columns: a column of a domain with a check would make Postgres
-- rewrite the whole table under its strongest lock (to check the NULL of
-- every existing row). The key's format is checked at the insert
-- (sms_outbox_intent, below), and no update may change it (0031).
ALTER TABLE sms_outbox
    ADD COLUMN IF NOT EXISTS idempotency_key text,
    ADD COLUMN IF NOT EXISTS send_at timestamptz,
    ADD COLUMN IF NOT EXISTS expires_at timestamptz;

-- The statuses: the check of 0001 gives way to one that knows the new
-- ones, added NOT VALID (a catalog change), validated apart (a scan that
-- lets writes go on; every row passes, the new list holds the old), and
-- renamed to the old name once the old check is gone.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_known')
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_valid'
                     AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%scheduled%') THEN
        ALTER TABLE sms_outbox ADD CONSTRAINT sms_outbox_status_known CHECK (status IN (
            'pending', 'scheduled', 'queued', 'sending', 'sent', 'delivered', 'undelivered',
            'dead', 'unknown', 'expired', 'cancelled', 'suppressed')) NOT VALID;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_known' AND NOT convalidated) THEN
        ALTER TABLE sms_outbox VALIDATE CONSTRAINT sms_outbox_status_known;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_known') THEN
        ALTER TABLE sms_outbox DROP CONSTRAINT IF EXISTS sms_outbox_status_valid;
        ALTER TABLE sms_outbox RENAME CONSTRAINT sms_outbox_status_known TO sms_outbox_status_valid;
    END IF;
END $$;

-- The attempts log records a sender's expiry decision ('expired'), as it
-- records the other decisions made without a call: the same three steps.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_known')
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_check'
                     AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%expired%') THEN
        ALTER TABLE sms_attempts ADD CONSTRAINT sms_attempts_outcome_known CHECK (outcome IN (
            'sent', 'retry', 'rate_limited', 'lookup', 'permanent', 'ambiguous', 'max_attempts', 'expired')) NOT VALID;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_known' AND NOT convalidated) THEN
        ALTER TABLE sms_attempts VALIDATE CONSTRAINT sms_attempts_outcome_known;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_known') THEN
        ALTER TABLE sms_attempts DROP CONSTRAINT IF EXISTS sms_attempts_outcome_check;
        ALTER TABLE sms_attempts RENAME CONSTRAINT sms_attempts_outcome_known TO sms_attempts_outcome_check;
    END IF;
END $$;

-- At most one row per key. The index holds keyed rows only. Built
-- concurrently; a build that failed part-way leaves an invalid index of
-- this name, dropped first.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_idempotency_key;
CREATE UNIQUE INDEX CONCURRENTLY sms_outbox_idempotency_key ON sms_outbox (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The relay's promotion of due scheduled rows reads this index's first
-- entries; nothing else reads a scheduled row.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_scheduled_idx;
CREATE INDEX CONCURRENTLY sms_outbox_scheduled_idx ON sms_outbox (send_at) WHERE status = 'scheduled';

-- The relay's expiry sweep: rows with an expiry that no one has claimed.
-- A row without expires_at (most) never has an entry.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_expiring_idx;
CREATE INDEX CONCURRENTLY sms_outbox_expiring_idx ON sms_outbox (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('scheduled', 'pending', 'queued');

-- Retention's second index: the rows finished without a call (expired,
-- cancelled, suppressed), by their last change, as sms_outbox_final_idx
-- holds the sent and dead ones. The console counts them from it too.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_unsent_idx;
CREATE INDEX CONCURRENTLY sms_outbox_unsent_idx ON sms_outbox (updated_at) INCLUDE (status)
    WHERE status IN ('expired', 'cancelled', 'suppressed');
