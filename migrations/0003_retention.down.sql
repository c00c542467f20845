DROP INDEX IF EXISTS sms_outbox_finished_idx;
