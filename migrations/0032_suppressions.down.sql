-- Back to 0031: the trigger function without the list (its search_path
-- pinned to pg_catalog and pg_temp again), and the list, its removals,
-- its functions and the console audit's detail gone. Rows already
-- suppressed stay so: 0030's status holds them.

CREATE OR REPLACE FUNCTION sms_outbox_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    move text := OLD.status || ' -> ' || NEW.status;
    doubt boolean := OLD.maybe_accepted OR OLD.lookup_pending OR OLD.lookup_everywhere OR OLD.status = 'sending';
    due boolean := NEW.expires_at IS NOT NULL AND NEW.expires_at <= pg_catalog.clock_timestamp();
BEGIN
    -- The table's CHECK would refuse it too, with the whole row in its
    -- detail.
    IF NEW.status = 'dead' AND NEW.maybe_accepted THEN
        RAISE EXCEPTION 'sms_outbox: a row an attempt may have reached (maybe_accepted) is never dead: end it unknown (sms_outbox_dead_never_maybe_accepted)'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'sms_outbox_dead_never_maybe_accepted',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    IF NEW.status IN ('expired', 'cancelled', 'suppressed') AND NEW.maybe_accepted THEN
        RAISE EXCEPTION 'sms_outbox: a row an attempt may have reached (maybe_accepted) is never %: evidence settles it', NEW.status
            USING ERRCODE = 'check_violation', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    IF NEW.status IN ('delivered', 'undelivered', 'dead', 'expired', 'cancelled', 'suppressed') THEN
        NEW.finished_at := pg_catalog.clock_timestamp();
    ELSIF NEW.status <> 'sent' THEN
        NEW.finished_at := NULL;
    END IF;
    IF NEW.status = 'pending' THEN
        NEW.attempt_count := 0;
    END IF;
    IF NEW.status = 'sending'
       AND NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        IF NEW.send_at IS NOT NULL AND NEW.send_at > pg_catalog.clock_timestamp() THEN
            RAISE EXCEPTION 'sms_outbox: no call before send_at: the row may not be claimed yet'
                USING ERRCODE = 'check_violation', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
        END IF;
        IF due AND NOT doubt THEN
            RAISE EXCEPTION 'sms_outbox: no call at or after expires_at: the row is expired, not claimed'
                USING ERRCODE = 'check_violation', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
        END IF;
    END IF;
    IF (move IN ('pending -> sending', 'queued -> sending',
                 'sending -> queued', 'sending -> dead', 'sending -> unknown',
                 'unknown -> dead', 'dead -> unknown',
                 'pending -> sent', 'queued -> sent', 'sending -> sent', 'unknown -> sent', 'dead -> sent',
                 'pending -> delivered', 'queued -> delivered', 'sending -> delivered', 'unknown -> delivered', 'sent -> delivered',
                 'pending -> undelivered', 'queued -> undelivered', 'sending -> undelivered', 'unknown -> undelivered', 'sent -> undelivered')
        OR (move IN ('pending -> expired', 'queued -> expired') AND due AND NOT doubt)
        OR (move = 'sending -> expired' AND due))
       AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF (move IN ('pending -> queued',
                 'unknown -> sent', 'unknown -> delivered', 'unknown -> undelivered', 'unknown -> dead',
                 'dead -> pending', 'unknown -> pending')
        OR (move IN ('queued -> dead', 'queued -> unknown', 'sending -> dead', 'sending -> unknown')
            AND NEW.attempt_count >= NEW.max_attempts)
        OR (move = 'scheduled -> pending' AND NEW.send_at <= pg_catalog.clock_timestamp())
        OR (move IN ('scheduled -> expired', 'pending -> expired', 'queued -> expired') AND due AND NOT doubt))
       AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'sms_outbox: % may not move a row from % to %', current_user, OLD.status, NEW.status
        USING ERRCODE = 'check_violation',
              DETAIL = 'Statuses move forward only, and each move only by the component that makes it (migration 0018); the relay ends only a row whose attempts are spent (migration 0026); a row expires only at its expiry, with no attempt that may have been taken (migration 0031).';
END;
$$;

ALTER FUNCTION sms_outbox_forward_only() SET search_path = pg_catalog, pg_temp;

DROP FUNCTION IF EXISTS sendonce_suppression_analyze();
DROP FUNCTION IF EXISTS sendonce_suppression_of(uuid);
DROP FUNCTION IF EXISTS sendonce_suppression_removed(text);
DROP FUNCTION IF EXISTS sendonce_suppression_check(text);
DROP FUNCTION IF EXISTS sendonce_console_suppress(text, text, text, text, text, text);
DROP FUNCTION IF EXISTS sendonce_suppress_remove(text, text, text, text);
DROP FUNCTION IF EXISTS sendonce_suppress_add(text[], text, text, text);
DROP FUNCTION IF EXISTS sendonce_suppress_inbound(text, text, text, boolean);
DROP FUNCTION IF EXISTS sendonce_suppress_rows(uuid[], text, text[], text[]);
DROP FUNCTION IF EXISTS sendonce_suppress(text, text);
DROP VIEW IF EXISTS sms_suppressions_masked;
DROP FUNCTION IF EXISTS sendonce_suppression_number(text);
DROP FUNCTION IF EXISTS sendonce_suppression_text(text);
DROP FUNCTION IF EXISTS sendonce_mask_number(text);
ALTER TABLE sendonce_console_audit DROP COLUMN IF EXISTS detail;
DROP TABLE IF EXISTS sms_suppression_removals;
DROP TABLE IF EXISTS sms_suppressions;
