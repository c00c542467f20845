-- Which delivery of which message a sender last handed back without
-- claiming the row: a graceful stop gives back the messages it fetched and
-- never started, and a delivery that meets a live claim backs off. Such a
-- delivery made no call. Without a record of it, the next delivery finds
-- the row showing a claim two or more deliveries back (claim_seq,
-- claim_delivery, migration 0017) and cannot tell the hand-back from a
-- claim a Postgres failover lost with its call: with several providers and
-- one of them unable to be asked, that doubt ends the row unknown without
-- any call (a rolling restart did exactly that).
--
-- A hand-back is recorded only where the row accounts for the delivery
-- before it (its claim, or its own hand-back), or for the first delivery
-- of a message; so a record that survives a failover says that nothing
-- before it was lost either (the standby replays the WAL in order).
-- Written once per hand-back, not on the pipeline's path: no index.
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS handback_seq bigint;
ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS handback_delivery integer;

GRANT SELECT (handback_seq, handback_delivery), UPDATE (handback_seq, handback_delivery) ON sms_outbox TO sendonce_sender;
