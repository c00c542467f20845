-- Back to 0028's moves and insert check, 0023's immutable intent, 0021's
-- fast path and 0026's purge; the application's functions and the insert
-- trigger of 0031 go, so that rows with a future send_at can no longer be
-- written (0030's down refuses to run while any is there).
DROP FUNCTION IF EXISTS sendonce_cancel(uuid);
DROP FUNCTION IF EXISTS sendonce_enqueue_batch(uuid[], text[], text[], text[], smallint[], timestamptz[], timestamptz[]);
DROP FUNCTION IF EXISTS sendonce_enqueue(uuid, text, text, text, smallint, timestamptz, timestamptz);
DROP TRIGGER IF EXISTS sms_outbox_intent ON sms_outbox;
DROP FUNCTION IF EXISTS sms_outbox_intent();
REVOKE INSERT (idempotency_key, send_at, expires_at) ON sms_outbox FROM sendonce_app;

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

CREATE OR REPLACE TRIGGER sms_outbox_forward_only
    BEFORE UPDATE OF status ON sms_outbox
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NOT (
        (OLD.status = 'pending' AND NEW.status = 'queued'
         AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE'))
        OR (((OLD.status IN ('pending', 'queued') AND NEW.status = 'sending')
             OR (OLD.status = 'sending' AND NEW.status = 'queued')
             OR (OLD.status IN ('pending', 'queued', 'sending') AND NEW.status = 'sent'))
            AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE'))))
    EXECUTE FUNCTION sms_outbox_forward_only();

CREATE OR REPLACE FUNCTION sms_outbox_immutable_intent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.id OPERATOR(pg_catalog.=) OLD.id
        AND NEW.to_e164 OPERATOR(pg_catalog.=) OLD.to_e164
        AND NEW.body OPERATOR(pg_catalog.=) OLD.body
        AND NEW.priority OPERATOR(pg_catalog.=) OLD.priority) IS NOT TRUE THEN
        RAISE EXCEPTION 'sms_outbox: id, to_e164, body and priority are immutable (insert a new row instead)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS sms_outbox_immutable_intent ON sms_outbox;
CREATE TRIGGER sms_outbox_immutable_intent
    BEFORE UPDATE OF id, to_e164, body, priority ON sms_outbox
    FOR EACH ROW EXECUTE FUNCTION sms_outbox_immutable_intent();

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

CREATE OR REPLACE FUNCTION sendonce_purge(older_than interval, max_rows integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
    -- Rows finished before migration 0026 have no finish time.
    cutover timestamptz := (SELECT m.applied_at FROM sendonce_schema_migrations m WHERE m.version = 26);
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'sendonce_purge: older_than must be at least 1 hour (the retention floor), not %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'sendonce_purge: max_rows must be 1 to 10000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The retention rule (docs/design.md): sent, delivered and undelivered
    -- rows, and dead rows whose dead letter is stored, that finished at
    -- least older_than ago; never a pending, queued, sending or unknown
    -- row. Rows another purger holds are skipped.
    DELETE FROM sms_outbox WHERE id IN (
        SELECT o.id FROM sms_outbox o
        WHERE o.status IN ('sent', 'delivered', 'undelivered', 'dead') AND o.updated_at < pg_catalog.now() - older_than
          AND (o.finished_at < pg_catalog.now() - older_than
               OR (o.finished_at IS NULL AND cutover < pg_catalog.now() - interval '1 hour'))
          AND (o.status <> 'dead' OR o.letter_seq IS NOT NULL)
        ORDER BY o.updated_at
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

DO $$
DECLARE
    owner name := (SELECT c.relowner::regrole::name FROM pg_catalog.pg_class c WHERE c.oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION sendonce_purge(interval, integer) OWNER TO %I', owner);
    EXECUTE pg_catalog.format('ALTER FUNCTION sendonce_purge(interval, integer) SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
    REVOKE ALL ON FUNCTION sendonce_purge(interval, integer) FROM PUBLIC;
    FOREACH f IN ARRAY ARRAY['sms_outbox_forward_only()', 'sms_outbox_immutable_intent()', 'sms_outbox_refuse_insert()'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
