-- sendonce:no-transaction
-- Refused while sms_outbox holds rows unless forced: roll back binaries, not
-- schema. Rows made unknown by the up migration stay unknown.
REVOKE SELECT ON sendonce_schema_migrations FROM sendonce_app, sendonce_relay, sendonce_sender;
ALTER TABLE sms_outbox DROP CONSTRAINT IF EXISTS sms_outbox_dead_never_maybe_accepted;
ALTER TABLE sms_attempts RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_limit);
ALTER TABLE sms_outbox RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_limit);
