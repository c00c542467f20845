-- The insert trigger and the domains' NOT NULL checks go (the table's
-- NOT NULLs and CHECKs refuse the same rows, with the row in the detail);
-- sms_outbox_forward_only is 0026's again.
DROP TRIGGER IF EXISTS sms_outbox_refuse_insert ON sms_outbox;
DROP FUNCTION IF EXISTS sms_outbox_refuse_insert();
ALTER DOMAIN sendonce_e164 DROP CONSTRAINT IF EXISTS sms_outbox_to_e164_required;
ALTER DOMAIN sendonce_body DROP CONSTRAINT IF EXISTS sms_outbox_body_required;

CREATE OR REPLACE FUNCTION sms_outbox_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    move text := OLD.status || ' -> ' || NEW.status;
BEGIN
    IF NEW.status IN ('delivered', 'undelivered', 'dead') THEN
        NEW.finished_at := pg_catalog.clock_timestamp();
    ELSIF NEW.status <> 'sent' THEN
        NEW.finished_at := NULL;
    END IF;
    IF NEW.status = 'pending' THEN
        NEW.attempt_count := 0;
    END IF;
    IF move IN ('pending -> sending', 'queued -> sending',
                'sending -> queued', 'sending -> dead', 'sending -> unknown',
                'unknown -> dead', 'dead -> unknown',
                'pending -> sent', 'queued -> sent', 'sending -> sent', 'unknown -> sent', 'dead -> sent',
                'pending -> delivered', 'queued -> delivered', 'sending -> delivered', 'unknown -> delivered', 'sent -> delivered',
                'pending -> undelivered', 'queued -> undelivered', 'sending -> undelivered', 'unknown -> undelivered', 'sent -> undelivered')
       AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF (move IN ('pending -> queued',
                 'unknown -> sent', 'unknown -> delivered', 'unknown -> undelivered', 'unknown -> dead',
                 'dead -> pending', 'unknown -> pending')
        OR (move IN ('queued -> dead', 'queued -> unknown', 'sending -> dead', 'sending -> unknown')
            AND NEW.attempt_count >= NEW.max_attempts))
       AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'sms_outbox: % may not move a row from % to %', current_user, OLD.status, NEW.status
        USING ERRCODE = 'check_violation',
              DETAIL = 'Statuses move forward only, and each move only by the component that makes it (migration 0018); the relay ends only a row whose attempts are spent (migration 0026).';
END;
$$;

DO $$
BEGIN
    ALTER FUNCTION sms_outbox_forward_only() SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION sms_outbox_forward_only() FROM PUBLIC;
END $$;
