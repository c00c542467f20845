-- Serves the retention purge: finished rows, oldest last change first.
CREATE INDEX sms_outbox_finished_idx ON sms_outbox (updated_at) WHERE status IN ('sent', 'dead', 'unknown');
