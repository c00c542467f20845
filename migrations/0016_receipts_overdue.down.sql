-- A mark left on a sent row is harmless without the sweep: a sent row is
-- never claimed, and a receipt clears it.
DROP INDEX IF EXISTS sms_outbox_overdue_idx;
