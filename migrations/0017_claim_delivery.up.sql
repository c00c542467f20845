-- Which delivery of which message made a row's latest claim: the stream
-- sequence of the message and its delivery count. A sender that gets a
-- message again (a retry's NakWithDelay, an ack deadline passed) checks
-- that the row shows the claim of the delivery before: then it knows what
-- that delivery did (the row says it), and calls as the row allows. When
-- the row does not show it, a Postgres failover may have lost that claim
-- and its outcome with the old primary, and at a provider without
-- idempotency the sender asks the provider before anything is sent again.
-- Written by the claim with the columns it already writes: no index, no
-- further row version.
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS claim_seq bigint;
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS claim_delivery integer;

GRANT SELECT (claim_seq, claim_delivery), UPDATE (claim_seq, claim_delivery) ON sms_outbox TO sendonce_sender;
