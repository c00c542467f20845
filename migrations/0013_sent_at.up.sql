-- When sendonce first recorded that the provider took the message: the
-- sender's write of its answer, a lookup that found it, or a receipt that
-- came first. With it the row describes a message sent on its first attempt
-- whole (attempt_count 1, publish_gen 0, provider_ref, sent_at), and the
-- senders no longer log that attempt in sms_attempts: the log keeps the
-- attempts a row cannot describe (retries, failures, 429s, lookups, any
-- attempt after the first, every attempt of a replayed row).
-- Adding a column without a default rewrites nothing.
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS sent_at timestamptz;

-- The writers of an accepted status set it; the console reads it.
GRANT SELECT (sent_at), UPDATE (sent_at) ON sms_outbox TO sendonce_sender;
GRANT SELECT (sent_at), UPDATE (sent_at) ON sms_outbox TO sendonce_receiver;
GRANT SELECT (sent_at), UPDATE (sent_at) ON sms_outbox TO sendonce_relay;
GRANT SELECT (sent_at) ON sms_outbox TO sendonce_console;
