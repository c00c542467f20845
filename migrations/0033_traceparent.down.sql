-- Back to 0032: no trace context in the rows, and 0031's
-- sendonce_enqueue and sendonce_enqueue_batch again.
DROP FUNCTION IF EXISTS sendonce_enqueue(uuid, text, text, text, smallint, timestamptz, timestamptz, text);
DROP FUNCTION IF EXISTS sendonce_enqueue_batch(uuid[], text[], text[], text[], smallint[], timestamptz[], timestamptz[], text);

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

DO $$
DECLARE
    owner name := (SELECT c.relowner::regrole::name FROM pg_catalog.pg_class c WHERE c.oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    -- As in 0031: each definer function owned by the table's owner, its
    -- search_path pinned (pg_catalog, the tables' schema, pg_temp), no
    -- EXECUTE for PUBLIC.
    FOREACH f IN ARRAY ARRAY['sendonce_enqueue(uuid, text, text, text, smallint, timestamptz, timestamptz)',
                             'sendonce_enqueue_batch(uuid[], text[], text[], text[], smallint[], timestamptz[], timestamptz[])'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, pg_catalog.current_schema());
    END LOOP;
END $$;

GRANT EXECUTE ON FUNCTION sendonce_enqueue(uuid, text, text, text, smallint, timestamptz, timestamptz) TO sendonce_app;
GRANT EXECUTE ON FUNCTION sendonce_enqueue_batch(uuid[], text[], text[], text[], smallint[], timestamptz[], timestamptz[]) TO sendonce_app;

ALTER TABLE sms_outbox DROP COLUMN IF EXISTS traceparent;
