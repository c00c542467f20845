-- sendonce:no-transaction
-- Receipts overdue: a sent row whose delivery receipt has not come after
-- SENDER_RECEIPT_OVERDUE (its write lost with a failed-over primary, never
-- sent by the provider, or given up on while the receiver could not take
-- it) is looked up at the provider by the senders' sweep
-- (internal/sender/overdue.go), which marks it with lookup_pending (on a
-- sent row: its fate is to be asked for) and schedules each look in
-- next_attempt_at. A sent row is never claimed for sending, so neither
-- column means anything else there; a receipt, or the sweep's last look,
-- clears the mark.
--
-- The index holds only the marked rows: the rows whose receipt is overdue
-- and whose looks are still scheduled, by when the next one is due, with
-- the time they were sent (updated_at, which the marks leave alone). The
-- sweep claims due rows from its first entries, and the relay measures the
-- backlog (its depth and its oldest row) from it. Every other row fails
-- the predicate: a message that gets its receipt, as nearly all do, never
-- has an entry, and its writes log nothing more. bench -only pipeline, WAL
-- per message, medians of three runs: 1,402 B and 12.9 records before,
-- 1,404 B and 12.9 records with this index; an index of every sent row
-- ((updated_at) WHERE status = 'sent') logged 1,471 B and 13.9 records.
-- Built concurrently (it is empty, but the build reads the table); a build
-- that failed part-way leaves an invalid index of this name, dropped first.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_overdue_idx;
CREATE INDEX CONCURRENTLY sms_outbox_overdue_idx ON sms_outbox (next_attempt_at) INCLUDE (updated_at)
    WHERE status = 'sent' AND lookup_pending;
