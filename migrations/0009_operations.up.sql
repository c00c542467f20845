-- sendonce:no-transaction
-- Operations at scale. This file runs outside a transaction, one statement at
-- a time, so that no statement holds a lock that blocks writers for longer
-- than a catalog change (and none waits for one longer than the migrator's
-- lock timeout). Every statement is safe to run again.

-- Autovacuum per table. Every message leaves about four dead row versions in
-- sms_outbox (three status updates that cannot be HOT, since status and
-- updated_at are indexed, and the retention delete) and one in sms_attempts
-- (the delete). The default trigger (20 % of the table dead) lets a
-- 100M-row table carry 20M dead rows before a vacuum starts, and the default
-- cost limit (200, shared by every worker) then takes hours; bloat makes
-- every claim and index scan slower meanwhile. Start at 1 % (plus a
-- constant so small tables are not vacuumed all the time) and let this
-- table's worker do ten times the default work between its sleeps.
-- SET (...) on a table takes a SHARE UPDATE EXCLUSIVE lock: writes go on.
ALTER TABLE sms_outbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000
);

-- sms_attempts is mostly appended to: vacuum after inserts too, so its
-- visibility map stays current (index-only scans of the attempt log), and
-- after the retention deletes.
ALTER TABLE sms_attempts SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_limit = 2000
);

-- "dead" means the user got nothing; a row an attempt may have reached the
-- provider with (maybe_accepted) ends unknown instead. The senders decide
-- this, but during a rolling upgrade a sender of an older release could
-- still write dead over a row a newer one marked: the database now refuses
-- it. Added NOT VALID (a brief ACCESS EXCLUSIVE lock, no scan; new writes are
-- checked at once), then validated by a scan that takes only a SHARE UPDATE
-- EXCLUSIVE lock, so writes go on during it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'sms_outbox'::regclass
                     AND conname = 'sms_outbox_dead_never_maybe_accepted') THEN
        ALTER TABLE sms_outbox ADD CONSTRAINT sms_outbox_dead_never_maybe_accepted
            CHECK (NOT (status = 'dead' AND maybe_accepted)) NOT VALID;
    END IF;
END $$;

-- A row that is already dead with maybe_accepted set was written by a
-- release that could race like that: it becomes unknown, as the senders
-- would have made it, so that a person decides (I7: dead only for rows the
-- provider never took). Row locks only; no table lock beyond an update's.
UPDATE sms_outbox
SET status = 'unknown',
    end_reason = 'ambiguous',
    last_error = left(coalesce(last_error || '; ', '') || 'made unknown by migration 0009: dead, but an attempt may have reached the provider', 1000),
    updated_at = now()
WHERE status = 'dead' AND maybe_accepted;

ALTER TABLE sms_outbox VALIDATE CONSTRAINT sms_outbox_dead_never_maybe_accepted;

-- Every binary checks the schema version at start-up, as its own role.
GRANT SELECT ON sendonce_schema_migrations TO sendonce_app, sendonce_relay, sendonce_sender;

-- This migration granted pg_read_all_stats to sendonce_relay, for its
-- oldest-transaction gauge. That role reads every session's SQL on the
-- server, and the relay's login had no need of it: migration 0027 takes it
-- away and gives the relay the one figure through a function. Roles are
-- the server's, so a database migrated from scratch no longer grants it
-- here, where it would hold it until 0027 ran (and, for another database
-- of the server still on an older release, for good).
