-- Every function and trigger of the outbox names the functions it calls
-- with their schema, and runs with a search_path of its own.
--
-- A function that runs with the table owner's rights (SECURITY DEFINER:
-- the receiver's receipts, the console's replay, the relay's purge) looks
-- up the functions and operators its body names when it runs, through its
-- search_path (pg_catalog, the tables' schema, pg_temp). pg_catalog first
-- wins only between functions of the same argument types: a function of
-- the tables' schema whose arguments match better is chosen over the
-- built-in one. cardinality, unnest, count and array_agg take any array or
-- any element in pg_catalog, so public.cardinality(uuid[]) is an exact
-- match for a call on a uuid[]; the same holds for an operator on a domain
-- (pg_catalog has none on sendonce_e164 or sendonce_body). Where a login
-- may create in that schema (PUBLIC on a database upgraded from Postgres
-- 14 or earlier), an application's login planted public.cardinality(uuid[])
-- and the receipts' function ran it as the table's owner: it read every
-- number and body, and disabled the forward-only trigger. The triggers run
-- as whoever writes (the owner included) and took the writer's search_path:
-- an operator planted for the body's domain let the owner's UPDATE change
-- a body and ran the planted code as the owner.
--
-- Now every function call below is pg_catalog's by name; an operator on a
-- domain is pg_catalog's by OPERATOR(pg_catalog.=) (it takes the domain as
-- its base type); the remaining operators are on built-in types (uuid,
-- text, integer, timestamptz, interval), for which pg_catalog holds an
-- exact match, found first: each function's search_path starts with
-- pg_catalog. The trigger functions read no table of ours: their
-- search_path is pg_catalog and pg_temp only. And `relay migrate` refuses
-- a schema where roles other than its owner may create (internal/migrate,
-- docs/security.md).
--
-- sendonce_replay_rows and sendonce_status call no function and compare
-- uuids only: they stay as they are. The masked view and the domains'
-- checks were bound to their functions when they were created (0022): the
-- view is made again with the names qualified, so that it no longer
-- depends on what was visible then.

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

-- I4. The number and the body are domains: their equality is named as
-- pg_catalog's (an operator on the domain, wherever it was created, would
-- match better than text's). A NULL anywhere (an UPDATE that sets the id
-- to NULL) is a change too.
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

CREATE OR REPLACE FUNCTION sms_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(pg_catalog.current_setting('sendonce.notify', true), '') <> 'off' THEN
        PERFORM pg_catalog.pg_notify('sms_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;

-- The receipts, as 0018 made them, with every call qualified. The
-- several arrays are unnested with ROWS FROM: unnest(a, b, ...) is
-- rewritten by the parser into one unnest per array, each looked up by
-- name, and a qualified pg_catalog.unnest takes one array.
CREATE OR REPLACE FUNCTION sendonce_apply_receipts(ids uuid[], statuses text[], refs text[], codes integer[],
                                                   reported timestamptz[], sources text[])
RETURNS TABLE (receipt bigint, prev_status text, moved boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(statuses)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(refs)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(codes)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(reported)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(sources) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: one status, ref, code, time and source per id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(statuses) AS s(status)
               WHERE s.status IS NULL OR s.status NOT IN ('sent', 'delivered', 'undelivered')) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: a receipt reports sent, delivered or undelivered'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT pg_catalog.count(DISTINCT u) FROM pg_catalog.unnest(ids) AS u) <> pg_catalog.cardinality(ids) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: one receipt per row in a call'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH v AS (
        SELECT * FROM ROWS FROM (pg_catalog.unnest(ids), pg_catalog.unnest(statuses), pg_catalog.unnest(refs),
                                 pg_catalog.unnest(codes), pg_catalog.unnest(reported), pg_catalog.unnest(sources))
                 WITH ORDINALITY AS v(id, status, ref, code, at, source, k)
    ), locked AS (
        SELECT o.id, o.status FROM sms_outbox o WHERE o.id = ANY(ids) ORDER BY o.id FOR NO KEY UPDATE
    ), ev AS (
        INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, code, reported_at, source)
        SELECT v.id, 'receipt', CASE v.status WHEN 'sent' THEN 'accepted' ELSE v.status END, v.ref, v.code, v.at, v.source
        FROM v JOIN locked USING (id)
        LEFT JOIN LATERAL (SELECT true AS dup FROM sms_evidence e
            WHERE e.outbox_id = v.id AND e.kind = 'receipt' AND e.source = v.source
              AND e.result = CASE v.status WHEN 'sent' THEN 'accepted' ELSE v.status END
              AND e.provider_ref IS NOT DISTINCT FROM v.ref AND e.code IS NOT DISTINCT FROM v.code
              AND e.reported_at IS NOT DISTINCT FROM v.at
            LIMIT 1) seen ON true
        WHERE seen.dup IS NULL
    ), upd AS (
        UPDATE sms_outbox o
        SET status = v.status, provider_ref = coalesce(o.provider_ref, v.ref), lookup_pending = false,
            sent_at = coalesce(o.sent_at, pg_catalog.clock_timestamp()), updated_at = pg_catalog.clock_timestamp()
        FROM v JOIN locked USING (id)
        WHERE o.id = v.id
          AND CASE WHEN v.status = 'sent' THEN locked.status IN ('pending', 'queued', 'sending', 'unknown')
                   ELSE locked.status IN ('pending', 'queued', 'sending', 'sent', 'unknown') END
        RETURNING o.id
    ), revived AS (
        UPDATE sms_outbox o
        SET status = v.status, provider_ref = coalesce(o.provider_ref, v.ref), lookup_pending = false,
            end_reason = NULL,
            last_error = 'was dead, then a ' || v.source || ' receipt reported the message '
                         || CASE v.status WHEN 'sent' THEN 'accepted' ELSE v.status END || ': the provider had it',
            sent_at = coalesce(o.sent_at, pg_catalog.clock_timestamp()), updated_at = pg_catalog.clock_timestamp()
        FROM v JOIN locked USING (id)
        WHERE o.id = v.id AND locked.status = 'dead'
        RETURNING o.id
    )
    SELECT v.k, locked.status, upd.id IS NOT NULL OR revived.id IS NOT NULL
    FROM v LEFT JOIN locked USING (id) LEFT JOIN upd USING (id) LEFT JOIN revived USING (id)
    ORDER BY v.k;
END;
$$;

-- The console's replay, second step, as 0018 made it, with every call
-- qualified.
CREATE OR REPLACE FUNCTION sendonce_console_replay(p_user text, p_role text, p_requested uuid[], p_ids uuid[], p_remote text)
RETURNS TABLE (audit_id bigint, audit_at timestamptz, replayed_rows uuid[])
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    moved uuid[];
BEGIN
    WITH locked AS (
        SELECT o.id FROM sms_outbox o
        WHERE o.id = ANY(p_ids) AND o.id = ANY(p_requested)
        ORDER BY o.id FOR NO KEY UPDATE
    ), upd AS (
        UPDATE sms_outbox o
        SET status = 'pending', publish_gen = o.publish_gen + 1, attempt_count = 0,
            next_attempt_at = pg_catalog.now(), updated_at = pg_catalog.now(), stream_seq = NULL,
            claim_id = NULL, lease_until = NULL, end_reason = NULL, letter_seq = NULL,
            last_error = 'replayed by operator; before: ' || coalesce(o.last_error, '')
        FROM locked
        WHERE o.id = locked.id AND o.status = 'dead' AND NOT o.maybe_accepted
          AND NOT EXISTS (SELECT 1 FROM sms_evidence e WHERE e.outbox_id = o.id
                          AND (e.kind = 'receipt' OR (e.kind = 'lookup' AND e.result IN ('found', 'several'))))
        RETURNING o.id
    )
    SELECT coalesce(pg_catalog.array_agg(t.u ORDER BY t.k), '{}') INTO moved
    FROM (SELECT DISTINCT ON (x.u) x.u, x.k FROM pg_catalog.unnest(p_ids) WITH ORDINALITY AS x(u, k) ORDER BY x.u, x.k) t
    WHERE t.u IN (SELECT upd.id FROM upd);
    INSERT INTO sendonce_console_audit (username, role, action, requested, replayed, refused, remote)
    VALUES (p_user, p_role, 'replay', p_requested, moved,
            pg_catalog.cardinality(p_requested) - pg_catalog.cardinality(moved), p_remote)
    RETURNING sendonce_console_audit.id, sendonce_console_audit.at INTO audit_id, audit_at;
    replayed_rows := moved;
    RETURN NEXT;
END;
$$;

-- Retention, as 0018 made it, with its one call qualified.
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

-- The masked number and the body's length, bound to pg_catalog's
-- functions whatever was visible when the view was made.
CREATE OR REPLACE VIEW sms_outbox_masked AS
SELECT id,
       CASE WHEN pg_catalog.length(to_e164) < 5 THEN '+***'
            ELSE pg_catalog.left(to_e164, 2) || pg_catalog.repeat('*', pg_catalog.length(to_e164) - 4)
                 || pg_catalog.right(to_e164, 2)
       END AS to_masked,
       pg_catalog.char_length(body) AS body_chars
FROM sms_outbox;

-- CREATE OR REPLACE resets a function's settings: each is pinned again.
-- The functions that run with the owner's rights as in 0018 (owned by the
-- table's owner, search_path pg_catalog, the tables' schema, pg_temp, no
-- EXECUTE for PUBLIC); the trigger functions with pg_catalog and pg_temp
-- only (pg_temp last: listed, it is searched after pg_catalog rather than
-- first; it is never searched for functions or operators).
DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[])',
                             'sendonce_console_replay(text, text, uuid[], uuid[], text)',
                             'sendonce_purge(interval, integer)'] LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    FOREACH f IN ARRAY ARRAY['sms_outbox_forward_only()', 'sms_outbox_immutable_intent()', 'sms_outbox_notify()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
