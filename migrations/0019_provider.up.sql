-- Which provider a row belongs to, and which provider each attempt went
-- to, where a sender has more than one (SMS_PROVIDERS). A claim names the
-- provider when the row has none; the row then stays with it, and only a
-- sender that knows none of its attempts can have reached that provider
-- moves it to another, with a write fenced on its claim before the other
-- provider is called. So a row names every provider that may hold its
-- message: lookups and the receipts' evidence go there, never elsewhere.
-- Written by statements that already write the row: no index, no further
-- row version.
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS provider text;
ALTER TABLE sms_attempts ADD COLUMN IF NOT EXISTS provider text;

GRANT SELECT (provider), UPDATE (provider) ON sms_outbox TO sendonce_sender;
GRANT SELECT (provider) ON sms_outbox TO sendonce_relay;
GRANT SELECT (provider) ON sms_outbox TO sendonce_console;
