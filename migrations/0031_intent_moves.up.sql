-- The moves of the new statuses (migration 0030), what every role's claim
-- may not skip, enforced where the row moves (I10), and what lets an
-- application use the new columns: the insert trigger, sendonce_enqueue,
-- sendonce_enqueue_batch and sendonce_cancel, owned, pinned and granted in
-- this one transaction (nothing is callable before it is locked down).
--
-- 1. The moves, by component (the rest of 0018's and 0026's stand):
--      sendonce_sender   pending, queued -> expired   its claim, at a row's
--                                                     expiry (no mark of an
--                                                     attempt that may have
--                                                     been taken)
--                        sending -> expired           its own claim's end: a
--                                                     lookup found nothing,
--                                                     or the expiry came
--                                                     before the call
--      sendonce_relay    scheduled -> pending         send_at has come
--                        scheduled, pending, queued   its sweep, at the
--                          -> expired                 expiry, unmarked
--      sendonce_app      none directly: sendonce_cancel (the owner's
--                        rights) moves pending, scheduled, queued ->
--                        cancelled
--    A move into expired needs the expiry to have come (expires_at is part
--    of the intent: no component may write it) and no mark of doubt: a
--    stolen relay's or sender's login cannot expire a row early, and
--    expiry never overrides an attempt that may have been taken. Nothing
--    leaves expired, cancelled or suppressed (they are in no list).
-- 2. A claim (any move into sending, by any role but the owner) of a row
--    whose send_at has not come, or whose expiry has come with no mark of
--    doubt, is skipped: the row is left as it is (the trigger returns
--    NULL), as if another claim held it. The senders' claim ends such a
--    row expired itself (and never claims a scheduled one), so this stops
--    only a statement that skipped the rule, or one that raced the expiry
--    by a millisecond, without failing the rest of its batch. The claim
--    therefore always runs the function: the sender's pending/queued ->
--    sending leave the WHEN's fast path of 0021.
--    The relay may end only a row no call was counted for
--    (attempt_count 0, which it cannot write): it may write the marks of
--    doubt, so these alone would not stop it from expiring, and then
--    purging, a row a call may have reached.
-- 3. Evidence outranks a conclusion, as for dead (I7): the provider's
--    answer, or a lookup that finds the message, moves an expired or
--    cancelled row to sent, delivered or undelivered (a failover can lose
--    the writes that showed an attempt, and the row then reads as if none
--    had been made).
-- 4. finished_at (0026) is set by the moves into the new final statuses
--    too, and the purge deletes them (sms_outbox_unsent_idx, 0030) once
--    they finished older_than ago.
-- 5. idempotency_key, send_at and expires_at are immutable, like the
--    number and the body.
-- 6. The insert check of 0028 knows the new statuses (a row written with
--    a future send_at is scheduled by sms_outbox_intent, which fires
--    first: triggers fire by name).

-- A key is 1 to 255 characters, none a control character; a row written
-- with a future send_at is scheduled; an expiry not after the send time
-- is refused. The messages name the rule, never a value. The WHEN keeps
-- the function off every insert that sets none of the three.
CREATE OR REPLACE FUNCTION sms_outbox_intent() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.idempotency_key IS NOT NULL AND (pg_catalog.char_length(NEW.idempotency_key) NOT BETWEEN 1 AND 255
                                            OR NEW.idempotency_key ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'sms_outbox: idempotency_key must be 1 to 255 characters, none a control character'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'sms_outbox_idempotency_key_format';
    END IF;
    IF NEW.expires_at IS NOT NULL AND NEW.send_at IS NOT NULL AND NEW.expires_at <= NEW.send_at THEN
        RAISE EXCEPTION 'sms_outbox: expires_at must be after send_at'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'sms_outbox_expiry_after_send';
    END IF;
    IF NEW.status = 'pending' AND NEW.send_at IS NOT NULL AND NEW.send_at > pg_catalog.clock_timestamp() THEN
        NEW.status := 'scheduled';
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER sms_outbox_intent
    BEFORE INSERT ON sms_outbox
    FOR EACH ROW WHEN (NEW.idempotency_key IS NOT NULL OR NEW.send_at IS NOT NULL OR NEW.expires_at IS NOT NULL)
    EXECUTE FUNCTION sms_outbox_intent();

-- One intent, written once: the row, or the row the key already names.
-- Returns the row's id and whether this call wrote it; a key that names a
-- row with another number or body is refused (unique_violation, naming the
-- key's index, without the values), and nothing is written. Each
-- statement of a function sees what committed before it began: a
-- concurrent writer of the same key makes the INSERT wait for it, and the
-- SELECT after it then sees its row.
CREATE OR REPLACE FUNCTION sendonce_enqueue(p_id uuid, p_to text, p_body text, p_key text,
                                            p_priority smallint DEFAULT 2, p_send_at timestamptz DEFAULT NULL,
                                            p_expires_at timestamptz DEFAULT NULL)
RETURNS TABLE (id uuid, created boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    got uuid;
    same boolean;
BEGIN
    INSERT INTO sms_outbox AS o (id, to_e164, body, priority, idempotency_key, send_at, expires_at)
    VALUES (p_id, p_to, p_body, coalesce(p_priority, 2), p_key, p_send_at, p_expires_at)
    ON CONFLICT DO NOTHING
    RETURNING o.id INTO got;
    IF got IS NOT NULL THEN
        id := got;
        created := true;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT o.id, (o.to_e164 OPERATOR(pg_catalog.=) p_to AND o.body OPERATOR(pg_catalog.=) p_body)
    INTO got, same
    FROM sms_outbox o WHERE o.idempotency_key OPERATOR(pg_catalog.=) p_key;
    IF got IS NULL AND EXISTS (SELECT 1 FROM sms_outbox o WHERE o.id = p_id) THEN
        RAISE EXCEPTION 'sendonce_enqueue: the id already names a message: mint a new one'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'sms_outbox_pkey';
    END IF;
    IF got IS NULL THEN
        -- The key's row is gone again (purged, or its writer rolled back
        -- after the INSERT waited for it): writing again may succeed.
        RAISE EXCEPTION 'sendonce_enqueue: the key''s message vanished while this one waited for it: try again'
            USING ERRCODE = 'serialization_failure';
    END IF;
    IF NOT same THEN
        RAISE EXCEPTION 'sendonce_enqueue: the idempotency key already names a message with another number or body'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'sms_outbox_idempotency_key';
    END IF;
    id := got;
    created := false;
    RETURN NEXT;
END;
$$;

-- sendonce_enqueue for a batch, in one statement: returns one (id,
-- created) per input, in input order. Two inputs with the same key are
-- one message (the first's), and both get its id.
CREATE OR REPLACE FUNCTION sendonce_enqueue_batch(p_ids uuid[], p_tos text[], p_bodies text[], p_keys text[],
                                                  p_priorities smallint[], p_send_ats timestamptz[], p_expires timestamptz[])
RETURNS TABLE (id uuid, created boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    inserted uuid[];
    bad bigint;
BEGIN
    IF pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_tos)
       OR pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_bodies)
       OR pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_keys)
       OR pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_priorities)
       OR pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_send_ats)
       OR pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_expires) THEN
        RAISE EXCEPTION 'sendonce_enqueue_batch: one number, body, key, priority, send time and expiry per id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT pg_catalog.count(DISTINCT u) FROM pg_catalog.unnest(p_ids) AS u) <> pg_catalog.cardinality(p_ids) THEN
        RAISE EXCEPTION 'sendonce_enqueue_batch: an id appears twice: each message needs an id of its own'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH ins AS (
        INSERT INTO sms_outbox AS o (id, to_e164, body, priority, idempotency_key, send_at, expires_at)
        SELECT v.id, v.t, v.b, coalesce(v.p, 2), v.k, v.s, v.e
        FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_tos), pg_catalog.unnest(p_bodies),
                        pg_catalog.unnest(p_keys), pg_catalog.unnest(p_priorities), pg_catalog.unnest(p_send_ats),
                        pg_catalog.unnest(p_expires)) WITH ORDINALITY AS v(id, t, b, k, p, s, e, n)
        -- By key: two batches with the same keys in other orders take the
        -- keys' index entries in the same order, and cannot deadlock.
        ORDER BY v.k NULLS LAST, v.n
        ON CONFLICT DO NOTHING
        RETURNING o.id
    )
    SELECT coalesce(pg_catalog.array_agg(ins.id), '{}') INTO inserted FROM ins;
    -- Each input not inserted: the row its key names (this batch's own, or
    -- an earlier one), which must hold the same number and body.
    SELECT pg_catalog.count(*) INTO bad
    FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_tos), pg_catalog.unnest(p_bodies),
                    pg_catalog.unnest(p_keys)) AS v(id, t, b, k)
    LEFT JOIN sms_outbox o ON o.idempotency_key OPERATOR(pg_catalog.=) v.k
    WHERE NOT (v.id = ANY (inserted))
      AND (o.id IS NULL OR NOT (o.to_e164 OPERATOR(pg_catalog.=) v.t AND o.body OPERATOR(pg_catalog.=) v.b));
    IF bad > 0 THEN
        RAISE EXCEPTION 'sendonce_enqueue_batch: % of the messages carry an idempotency key that already names a message with another number or body (or could not be written)', bad
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'sms_outbox_idempotency_key';
    END IF;
    RETURN QUERY
    SELECT CASE WHEN v.id = ANY (inserted) THEN v.id ELSE o.id END, v.id = ANY (inserted)
    FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_keys)) WITH ORDINALITY AS v(id, k, n)
    LEFT JOIN sms_outbox o ON NOT (v.id = ANY (inserted)) AND o.idempotency_key OPERATOR(pg_catalog.=) v.k
    ORDER BY v.n;
END;
$$;

-- The application's cancel: a row no provider call has started for (and
-- none that may have been taken: no mark of doubt) ends 'cancelled'; any
-- other is left as it is. Returns the row's status after the call, NULL
-- when there is no row. The UPDATE takes the row's lock: a sender's claim
-- and a cancel are ordered by it, and the one that comes second finds the
-- other's status (a claim finds cancelled, terminal: it never calls; a
-- cancel finds sending: too late).
CREATE OR REPLACE FUNCTION sendonce_cancel(p_id uuid) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    st text;
BEGIN
    UPDATE sms_outbox o
    SET status = 'cancelled', updated_at = pg_catalog.clock_timestamp(), claim_id = NULL, lease_until = NULL,
        last_error = 'cancelled by the application'
    WHERE o.id = p_id AND o.status IN ('pending', 'scheduled', 'queued')
      AND NOT o.maybe_accepted AND NOT o.lookup_pending AND NOT o.lookup_everywhere
    RETURNING o.status INTO st;
    IF st IS NOT NULL THEN
        RETURN st;
    END IF;
    SELECT o.status INTO st FROM sms_outbox o WHERE o.id = p_id;
    RETURN st;
END;
$$;


CREATE OR REPLACE FUNCTION sms_outbox_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    move text;
    doubt boolean := OLD.maybe_accepted OR OLD.lookup_pending OR OLD.lookup_everywhere OR OLD.status = 'sending';
    due boolean := NEW.expires_at IS NOT NULL AND NEW.expires_at <= pg_catalog.clock_timestamp();
BEGIN
    -- The claim, once a message, first and cheapest: a row not yet due
    -- or past its expiry (unmarked) is skipped for every role but the
    -- owner; else the sender's claim goes through.
    IF NEW.status = 'sending' AND OLD.status IN ('pending', 'queued') THEN
        IF ((NEW.send_at IS NOT NULL AND NEW.send_at > pg_catalog.clock_timestamp()) OR (due AND NOT doubt))
           AND NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
            RETURN NULL;
        END IF;
        IF pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
            RETURN NEW;
        END IF;
    END IF;
    move := OLD.status || ' -> ' || NEW.status;
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
    -- Any other move into sending (none a component makes): the same rule.
    IF NEW.status = 'sending'
       AND ((NEW.send_at IS NOT NULL AND NEW.send_at > pg_catalog.clock_timestamp()) OR (due AND NOT doubt))
       AND NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN NULL;
    END IF;
    IF (move IN ('pending -> sending', 'queued -> sending',
                 'sending -> queued', 'sending -> dead', 'sending -> unknown',
                 'unknown -> dead', 'dead -> unknown',
                 'pending -> sent', 'queued -> sent', 'sending -> sent', 'unknown -> sent', 'dead -> sent',
                 'pending -> delivered', 'queued -> delivered', 'sending -> delivered', 'unknown -> delivered', 'sent -> delivered',
                 'pending -> undelivered', 'queued -> undelivered', 'sending -> undelivered', 'unknown -> undelivered', 'sent -> undelivered')
        OR (move IN ('pending -> expired', 'queued -> expired') AND due AND NOT doubt)
        OR (move = 'sending -> expired' AND due)
        OR move IN ('expired -> sent', 'expired -> delivered', 'expired -> undelivered',
                    'cancelled -> sent', 'cancelled -> delivered', 'cancelled -> undelivered'))
       AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF (move IN ('pending -> queued',
                 'unknown -> sent', 'unknown -> delivered', 'unknown -> undelivered', 'unknown -> dead',
                 'dead -> pending', 'unknown -> pending')
        OR (move IN ('queued -> dead', 'queued -> unknown', 'sending -> dead', 'sending -> unknown')
            AND NEW.attempt_count >= NEW.max_attempts)
        OR (move = 'scheduled -> pending' AND NEW.send_at <= pg_catalog.clock_timestamp())
        OR (move IN ('scheduled -> expired', 'pending -> expired', 'queued -> expired') AND due AND NOT doubt
            AND OLD.attempt_count = 0))
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

-- 0021's WHEN without the claim: every move into sending runs the
-- function (2 above). The relay's publication and the sender's retry and
-- answer keep their fast path.
CREATE OR REPLACE TRIGGER sms_outbox_forward_only
    BEFORE UPDATE OF status ON sms_outbox
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NOT (
        (OLD.status = 'pending' AND NEW.status = 'queued'
         AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE'))
        OR (((OLD.status = 'sending' AND NEW.status = 'queued')
             OR (OLD.status IN ('pending', 'queued', 'sending') AND NEW.status = 'sent'))
            AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE'))))
    EXECUTE FUNCTION sms_outbox_forward_only();

CREATE OR REPLACE FUNCTION sms_outbox_immutable_intent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.id OPERATOR(pg_catalog.=) OLD.id
        AND NEW.to_e164 OPERATOR(pg_catalog.=) OLD.to_e164
        AND NEW.body OPERATOR(pg_catalog.=) OLD.body
        AND NEW.priority OPERATOR(pg_catalog.=) OLD.priority
        AND NEW.idempotency_key IS NOT DISTINCT FROM OLD.idempotency_key
        AND NEW.send_at IS NOT DISTINCT FROM OLD.send_at
        AND NEW.expires_at IS NOT DISTINCT FROM OLD.expires_at) IS NOT TRUE THEN
        RAISE EXCEPTION 'sms_outbox: id, to_e164, body, priority, idempotency_key, send_at and expires_at are immutable (insert a new row instead)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

-- OR REPLACE: a DROP would take the table's strongest lock.
CREATE OR REPLACE TRIGGER sms_outbox_immutable_intent
    BEFORE UPDATE OF id, to_e164, body, priority, idempotency_key, send_at, expires_at ON sms_outbox
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
    con text := CASE WHEN NEW.status NOT IN ('pending', 'scheduled', 'queued', 'sending', 'sent', 'delivered', 'undelivered',
                                             'dead', 'unknown', 'expired', 'cancelled', 'suppressed')
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
                WHEN 'sms_outbox_status_valid' THEN 'status must be pending, scheduled, queued, sending, sent, delivered, undelivered, dead, unknown, expired, cancelled or suppressed'
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
        OR NEW.status NOT IN ('pending', 'scheduled', 'queued', 'sending', 'sent', 'delivered', 'undelivered',
                              'dead', 'unknown', 'expired', 'cancelled', 'suppressed')
        OR NEW.attempt_count < 0 OR NEW.max_attempts NOT BETWEEN 1 AND 1000 OR NEW.publish_gen < 0
        OR NEW.end_reason NOT IN ('permanent', 'max_attempts', 'ambiguous', 'invalid')
        OR NEW.priority NOT BETWEEN 1 AND 3 OR (NEW.status = 'dead' AND NEW.maybe_accepted))
    EXECUTE FUNCTION sms_outbox_refuse_insert();

-- 0026's purge, and the rows finished without a call (0030's statuses),
-- which always have a finish time, from their own index.
CREATE OR REPLACE FUNCTION sendonce_purge(older_than interval, max_rows integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
    m bigint;
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
    -- rows, dead rows whose dead letter is stored, and rows finished
    -- without a call (expired, cancelled, suppressed), that finished at
    -- least older_than ago; never a pending, scheduled, queued, sending or
    -- unknown row. Rows another purger holds are skipped.
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
    IF n < max_rows THEN
        DELETE FROM sms_outbox WHERE id IN (
            SELECT o.id FROM sms_outbox o
            WHERE o.status IN ('expired', 'cancelled', 'suppressed') AND o.updated_at < pg_catalog.now() - older_than
              AND o.finished_at < pg_catalog.now() - older_than
            ORDER BY o.updated_at
            LIMIT max_rows - n
            FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS m = ROW_COUNT;
        n := n + m;
    END IF;
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
    FOREACH f IN ARRAY ARRAY['sms_outbox_forward_only()', 'sms_outbox_immutable_intent()', 'sms_outbox_refuse_insert()',
                             'sms_outbox_intent()'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    -- As in 0018: each definer function owned by the table's owner, its
    -- search_path pinned (pg_catalog, the tables' schema, pg_temp), no
    -- EXECUTE for PUBLIC.
    FOREACH f IN ARRAY ARRAY['sendonce_enqueue(uuid, text, text, text, smallint, timestamptz, timestamptz)',
                             'sendonce_enqueue_batch(uuid[], text[], text[], text[], smallint[], timestamptz[], timestamptz[])',
                             'sendonce_cancel(uuid)', 'sms_outbox_intent()'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    FOREACH f IN ARRAY ARRAY['sendonce_enqueue(uuid, text, text, text, smallint, timestamptz, timestamptz)',
                             'sendonce_enqueue_batch(uuid[], text[], text[], text[], smallint[], timestamptz[], timestamptz[])',
                             'sendonce_cancel(uuid)'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, pg_catalog.current_schema());
    END LOOP;
END $$;

GRANT EXECUTE ON FUNCTION sendonce_enqueue(uuid, text, text, text, smallint, timestamptz, timestamptz) TO sendonce_app;
GRANT EXECUTE ON FUNCTION sendonce_enqueue_batch(uuid[], text[], text[], text[], smallint[], timestamptz[], timestamptz[]) TO sendonce_app;
GRANT EXECUTE ON FUNCTION sendonce_cancel(uuid) TO sendonce_app;
GRANT INSERT (idempotency_key, send_at, expires_at) ON sms_outbox TO sendonce_app;
-- The pipeline reads the times; the relay moves scheduled and expiring
-- rows (its statements), the senders decide expiry at their claim.
GRANT SELECT (send_at, expires_at) ON sms_outbox TO sendonce_relay, sendonce_sender, sendonce_console;
-- The claim keeps a row's last error unless it ends the row expired.
GRANT SELECT (last_error) ON sms_outbox TO sendonce_sender;
