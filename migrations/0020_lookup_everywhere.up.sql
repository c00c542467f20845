-- lookup_everywhere: a claim found that the row's records may have lost
-- an attempt (and so a move to another provider of SMS_PROVIDERS), and
-- could not yet hear "none" from every other provider: the next claim asks
-- them first, even if nothing else about it is in doubt.
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS lookup_everywhere boolean NOT NULL DEFAULT false;

GRANT SELECT (lookup_everywhere), UPDATE (lookup_everywhere) ON sms_outbox TO sendonce_sender;
-- A claim that finds no provider on an attempted row takes the one its
-- calls went to (migration 0019 gave the attempts their provider).
GRANT SELECT (id, provider, outcome) ON sms_attempts TO sendonce_sender;
