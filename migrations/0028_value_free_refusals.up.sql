-- A refused write says which rule it broke, and carries neither the
-- number nor the body.
--
-- Postgres describes a row that breaks a table's CHECK or NOT NULL in the
-- error's detail: "Failing row contains (<id>, +15551234567, Your code is
-- 482901, ...)" (to a role that may read those columns, or that wrote
-- them: the owner, the application, the senders). The detail goes to the
-- client, which may log it, and to the server's log (log_error_verbosity
-- default or verbose). An application in another language that inserted
-- a bad priority, or no body, put the number and the body in both. A
-- domain's check, and an error a trigger raises, carry no value:
-- "value for domain sendonce_e164 violates check constraint ...".
--
-- What can fail at an INSERT, and where it is now refused:
--
--   to_e164, body NULL         the domains' checks sms_outbox_to_e164_required
--                              and sms_outbox_body_required (beside their
--                              format and length checks of 0022); a domain's
--                              check runs for a column left out too.
--   every other NOT NULL and   sms_outbox_refuse_insert, a BEFORE INSERT
--   CHECK of the table         trigger, raising not_null_violation naming
--                              the column, or check_violation naming the
--                              constraint, with a message of its own and no
--                              value. Its WHEN holds the rules, so that a
--                              good row never calls the function.
--
-- The table keeps its constraints, for UPDATEs and as the last word: the
-- trigger refuses first at an INSERT. Of the UPDATEs, the one a component
-- can make (a sender of an older release writing dead over a row a newer
-- one marked maybe_accepted, 0009) is refused by sms_outbox_forward_only
-- first, the same way; the others would need a status or a count no
-- component writes. A primary key's duplicate names the id only.
--
-- Added NOT VALID: every row passed them as NOT NULL columns.
ALTER DOMAIN sendonce_e164 ADD CONSTRAINT sms_outbox_to_e164_required CHECK (VALUE IS NOT NULL) NOT VALID;
ALTER DOMAIN sendonce_body ADD CONSTRAINT sms_outbox_body_required CHECK (VALUE IS NOT NULL) NOT VALID;

CREATE OR REPLACE FUNCTION sms_outbox_refuse_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    col text := CASE WHEN NEW.id IS NULL THEN 'id'
                     WHEN NEW.status IS NULL THEN 'status'
                     WHEN NEW.attempt_count IS NULL THEN 'attempt_count'
                     WHEN NEW.max_attempts IS NULL THEN 'max_attempts'
                     WHEN NEW.publish_gen IS NULL THEN 'publish_gen'
                     WHEN NEW.next_attempt_at IS NULL THEN 'next_attempt_at'
                     WHEN NEW.created_at IS NULL THEN 'created_at'
                     WHEN NEW.updated_at IS NULL THEN 'updated_at'
                     WHEN NEW.maybe_accepted IS NULL THEN 'maybe_accepted'
                     WHEN NEW.priority IS NULL THEN 'priority'
                     WHEN NEW.lookup_pending IS NULL THEN 'lookup_pending'
                     WHEN NEW.lookups IS NULL THEN 'lookups'
                     WHEN NEW.lookup_everywhere IS NULL THEN 'lookup_everywhere' END;
    con text := CASE WHEN NEW.status NOT IN ('pending', 'queued', 'sending', 'sent', 'delivered', 'undelivered', 'dead', 'unknown')
                          THEN 'sms_outbox_status_valid'
                     WHEN NEW.attempt_count < 0 THEN 'sms_outbox_attempt_count_check'
                     WHEN NEW.max_attempts NOT BETWEEN 1 AND 1000 THEN 'sms_outbox_max_attempts_check'
                     WHEN NEW.publish_gen < 0 THEN 'sms_outbox_publish_gen_check'
                     WHEN NEW.end_reason NOT IN ('permanent', 'max_attempts', 'ambiguous', 'invalid') THEN 'sms_outbox_end_reason_valid'
                     WHEN NEW.priority NOT BETWEEN 1 AND 3 THEN 'sms_outbox_priority_valid'
                     WHEN NEW.status = 'dead' AND NEW.maybe_accepted THEN 'sms_outbox_dead_never_maybe_accepted' END;
BEGIN
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'sms_outbox: % is required', col
            USING ERRCODE = 'not_null_violation', COLUMN = col, TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    IF con IS NOT NULL THEN
        RAISE EXCEPTION 'sms_outbox: %', CASE con
                WHEN 'sms_outbox_status_valid' THEN 'status must be pending, queued, sending, sent, delivered, undelivered, dead or unknown'
                WHEN 'sms_outbox_attempt_count_check' THEN 'attempt_count must not be negative'
                WHEN 'sms_outbox_max_attempts_check' THEN 'max_attempts must be 1 to 1000'
                WHEN 'sms_outbox_publish_gen_check' THEN 'publish_gen must not be negative'
                WHEN 'sms_outbox_end_reason_valid' THEN 'end_reason must be permanent, max_attempts, ambiguous or invalid'
                WHEN 'sms_outbox_priority_valid' THEN 'priority must be 1 (urgent), 2 (normal) or 3 (bulk)'
                ELSE 'a row an attempt may have reached (maybe_accepted) is never dead'
            END || ' (' || con || ')'
            USING ERRCODE = 'check_violation', CONSTRAINT = con, TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER sms_outbox_refuse_insert
    BEFORE INSERT ON sms_outbox
    FOR EACH ROW WHEN (NEW.id IS NULL OR NEW.status IS NULL OR NEW.attempt_count IS NULL OR NEW.max_attempts IS NULL
        OR NEW.publish_gen IS NULL OR NEW.next_attempt_at IS NULL OR NEW.created_at IS NULL OR NEW.updated_at IS NULL
        OR NEW.maybe_accepted IS NULL OR NEW.priority IS NULL OR NEW.lookup_pending IS NULL OR NEW.lookups IS NULL
        OR NEW.lookup_everywhere IS NULL
        OR NEW.status NOT IN ('pending', 'queued', 'sending', 'sent', 'delivered', 'undelivered', 'dead', 'unknown')
        OR NEW.attempt_count < 0 OR NEW.max_attempts NOT BETWEEN 1 AND 1000 OR NEW.publish_gen < 0
        OR NEW.end_reason NOT IN ('permanent', 'max_attempts', 'ambiguous', 'invalid')
        OR NEW.priority NOT BETWEEN 1 AND 3 OR (NEW.status = 'dead' AND NEW.maybe_accepted))
    EXECUTE FUNCTION sms_outbox_refuse_insert();

-- 0026's, refusing dead over maybe_accepted first.
CREATE OR REPLACE FUNCTION sms_outbox_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    move text := OLD.status || ' -> ' || NEW.status;
BEGIN
    -- The table's CHECK would refuse it too, with the whole row in its
    -- detail.
    IF NEW.status = 'dead' AND NEW.maybe_accepted THEN
        RAISE EXCEPTION 'sms_outbox: a row an attempt may have reached (maybe_accepted) is never dead: end it unknown (sms_outbox_dead_never_maybe_accepted)'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'sms_outbox_dead_never_maybe_accepted',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
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
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['sms_outbox_refuse_insert()', 'sms_outbox_forward_only()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
