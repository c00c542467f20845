-- sendonce:no-transaction
-- Serves the retention purge: finished rows, oldest last change first.
-- Built CONCURRENTLY so that writes go on while it builds on a large table
-- (a plain CREATE INDEX blocks every insert for the whole build). A build
-- that failed part-way leaves an invalid index of this name behind: dropping
-- it first makes the file safe to run again. Databases that applied this
-- migration before it ran concurrently are not affected (it is recorded by
-- version and never runs twice).
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_finished_idx;
CREATE INDEX CONCURRENTLY sms_outbox_finished_idx ON sms_outbox (updated_at) WHERE status IN ('sent', 'dead', 'unknown');
