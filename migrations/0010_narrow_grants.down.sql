-- The grants of before 0010 back: applications read the status columns
-- directly, the relay deletes finished rows itself.
GRANT SELECT (id, status, attempt_count, provider_ref, last_error, created_at, updated_at, priority)
    ON sms_outbox TO sendonce_app;
GRANT DELETE ON sms_outbox TO sendonce_relay;
GRANT DELETE ON sms_attempts TO sendonce_relay;
DROP FUNCTION IF EXISTS sendonce_status(uuid);
DROP FUNCTION IF EXISTS sendonce_purge(interval, integer);
