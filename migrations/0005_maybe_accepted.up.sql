-- Set once an attempt may have reached the provider without an answer that
-- says it failed (a lost response, a 5xx other than 503, a sender that died
-- mid-call). It never clears: a row whose attempts run out with it set ends
-- unknown, not dead, because "dead" tells the application the user got
-- nothing. A constant default makes this a catalog-only change.
ALTER TABLE sms_outbox ADD COLUMN maybe_accepted boolean NOT NULL DEFAULT false;

GRANT SELECT (maybe_accepted) ON sms_outbox TO sendonce_relay;
GRANT SELECT (maybe_accepted), UPDATE (maybe_accepted) ON sms_outbox TO sendonce_sender;
