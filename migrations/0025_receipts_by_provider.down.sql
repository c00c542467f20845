-- The receipts' function of 0023 (0018's, its calls qualified), which the
-- receiver of the release before calls: any valid receipt moves its row.
DROP FUNCTION sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[], text[]);

CREATE FUNCTION sendonce_apply_receipts(ids uuid[], statuses text[], refs text[], codes integer[],
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

DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = 'sms_outbox'::regclass);
    f text := 'sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[])';
BEGIN
    EXECUTE format('ALTER FUNCTION %s OWNER TO %I', f, owner);
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
END $$;
GRANT EXECUTE ON FUNCTION sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[])
    TO sendonce_receiver;
