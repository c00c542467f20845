REVOKE SELECT (id, provider, outcome) ON sms_attempts FROM sendonce_sender;
ALTER TABLE sms_outbox DROP COLUMN IF EXISTS lookup_everywhere;
