-- The relay writes attempt_count again (the replay of the release before
-- gives the attempts back itself), the forward-only trigger and the purge
-- are 0023's, and the finish time goes.
GRANT UPDATE (attempt_count) ON sms_outbox TO sendonce_relay;

DROP TRIGGER IF EXISTS sms_outbox_finished ON sms_outbox;
DROP FUNCTION IF EXISTS sms_outbox_finished();

CREATE OR REPLACE FUNCTION sms_outbox_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    move text := OLD.status || ' -> ' || NEW.status;
BEGIN
    IF move IN ('pending -> sending', 'queued -> sending',
                'sending -> queued', 'sending -> dead', 'sending -> unknown',
                'unknown -> dead', 'dead -> unknown',
                'pending -> sent', 'queued -> sent', 'sending -> sent', 'unknown -> sent', 'dead -> sent',
                'pending -> delivered', 'queued -> delivered', 'sending -> delivered', 'unknown -> delivered', 'sent -> delivered',
                'pending -> undelivered', 'queued -> undelivered', 'sending -> undelivered', 'unknown -> undelivered', 'sent -> undelivered')
       AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF move IN ('pending -> queued',
                'queued -> dead', 'queued -> unknown', 'sending -> dead', 'sending -> unknown',
                'unknown -> sent', 'unknown -> delivered', 'unknown -> undelivered', 'unknown -> dead',
                'dead -> pending', 'unknown -> pending')
       AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'sms_outbox: % may not move a row from % to %', current_user, OLD.status, NEW.status
        USING ERRCODE = 'check_violation',
              DETAIL = 'Statuses move forward only, and each move only by the component that makes it (migration 0018).';
END;
$$;

CREATE OR REPLACE FUNCTION sendonce_purge(older_than interval, max_rows integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'sendonce_purge: older_than must be at least 1 hour (the retention floor), not %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'sendonce_purge: max_rows must be 1 to 10000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM sms_outbox WHERE id IN (
        SELECT id FROM sms_outbox
        WHERE status IN ('sent', 'delivered', 'undelivered', 'dead') AND updated_at < pg_catalog.now() - older_than
          AND (status <> 'dead' OR letter_seq IS NOT NULL)
        ORDER BY updated_at
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = 'sms_outbox'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sendonce_purge(interval, integer) OWNER TO %I', owner);
    EXECUTE format('ALTER FUNCTION sendonce_purge(interval, integer) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION sendonce_purge(interval, integer) FROM PUBLIC;
    ALTER FUNCTION sms_outbox_forward_only() SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION sms_outbox_forward_only() FROM PUBLIC;
END $$;

ALTER TABLE sms_outbox DROP COLUMN IF EXISTS finished_at;
