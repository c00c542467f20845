-- The insert trigger's notification can be left out. Postgres serializes
-- the commits of every transaction that notified (a lock taken before its
-- commit record and held until that record is flushed), so with many
-- applications' connections inserting at once the notification caps their
-- commit rate: 8 connections inserting one row per transaction committed
-- 1,953 to 2,870 a second with it and 4,364 to 4,727 without (pgbench, 2
-- cores). With sendonce.notify = off, for the inserting role, database or
-- session, the relays find the rows by polling (RELAY_POLL_INTERVAL).
CREATE OR REPLACE FUNCTION sms_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('sendonce.notify', true), '') <> 'off' THEN
        PERFORM pg_notify('sms_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;
