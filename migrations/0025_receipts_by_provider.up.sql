-- A receipt settles only a row of the provider that signed it, and only
-- where that provider can have the message.
--
-- Until now any valid receipt moved the row it named, whichever secret
-- signed it: a receipt signed with the generic secret, saying delivered,
-- made a pending row of Twilio's delivered (and it was never sent); a
-- Sinch receipt revived a dead row of Vonage's. Each receipt secret ruled
-- every provider's rows, and a receipt could finish a row no provider had
-- been asked to send, or report another message than the row's.
--
-- sendonce_apply_receipts now takes, besides each receipt, the provider a
-- row that names none belongs to (unnamed), and refuses a receipt, with a
-- reason, when:
--
--   provider   the row's provider is not the receipt's source. A receipt's
--              source is the route it came by (generic, twilio, vonage,
--              sinch, telnyx), signed with that provider's secret, and
--              rows name their provider by the same names (migration
--              0019). Every claim under SMS_PROVIDERS names the row, so a
--              row that names none was sent with a single SMS_PROVIDER or
--              attempted before 0019: it belongs to `unnamed`, which the
--              receiver takes from its settings (RECEIPTS_DEFAULT_PROVIDER,
--              or the one provider whose receipts it verifies); 'none'
--              settles no such row. A NULL `unnamed` accepts the
--              receipt's own source, as before this migration (tests and
--              tools; the receiver always names one).
--   unsent     no provider can have the message: the row is pending,
--              queued or dead, has no attempt since it was written or
--              replayed (attempt_count), no answer (sent_at), no doubt
--              (maybe_accepted), and no attempt in its log (a replay gives
--              the attempts back and keeps the log). sending, sent and
--              unknown rows were claimed.
--   reference  the row records its provider's id for the message
--              (provider_ref, from the sender's answer, a lookup or an
--              earlier receipt) and the receipt names another: it reports
--              another message (a twin sent under the same reference). A
--              receipt that names no id is tied to the row by its
--              reference alone, as before.
--
-- A refused receipt changes nothing, not even the evidence: the receiver
-- answers it 2xx, as it answers a receipt for no row (a provider retries a
-- non-2xx answer for long), and counts and logs it (result "refused").
--
-- What the source rule guards against is a receipt secret: a signed
-- request reaches the function only through the receiver, whose settings
-- name both the source and `unnamed`. A stolen receiver login calls the
-- function with whatever it likes in both; against it the other two
-- rules hold, which rest on the row alone: it can no longer finish a row
-- that was never claimed, nor report another message than the row's.
--
-- The signature changes (the extra array, and the reason in the answer):
-- the function of 0018 is dropped, so a receiver of the release before
-- fails its writes and answers 503 until it is rolled (the provider sends
-- the receipts again), rather than keep the old rule.
DROP FUNCTION sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[]);

CREATE FUNCTION sendonce_apply_receipts(ids uuid[], statuses text[], refs text[], codes integer[],
                                        reported timestamptz[], sources text[], unnamed text[])
RETURNS TABLE (receipt bigint, prev_status text, moved boolean, refused text)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(statuses)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(refs)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(codes)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(reported)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(sources)
       OR pg_catalog.cardinality(ids) IS DISTINCT FROM pg_catalog.cardinality(unnamed) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: one status, ref, code, time, source and unnamed provider per id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(statuses) AS s(status)
               WHERE s.status IS NULL OR s.status NOT IN ('sent', 'delivered', 'undelivered')) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: a receipt reports sent, delivered or undelivered'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(sources) AS s(source) WHERE s.source IS NULL OR s.source = '') THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: every receipt names its source'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT pg_catalog.count(DISTINCT u) FROM pg_catalog.unnest(ids) AS u) <> pg_catalog.cardinality(ids) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: one receipt per row in a call'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH v AS (
        SELECT * FROM ROWS FROM (pg_catalog.unnest(ids), pg_catalog.unnest(statuses), pg_catalog.unnest(refs),
                                 pg_catalog.unnest(codes), pg_catalog.unnest(reported), pg_catalog.unnest(sources),
                                 pg_catalog.unnest(unnamed))
                 WITH ORDINALITY AS v(id, status, ref, code, at, source, unnamed, k)
    ), locked AS (
        SELECT o.id, o.status, o.provider, o.provider_ref, o.attempt_count, o.sent_at, o.maybe_accepted
        FROM sms_outbox o WHERE o.id = ANY(ids) ORDER BY o.id FOR NO KEY UPDATE
    ), judged AS (
        SELECT v.id, v.status, v.ref, v.code, v.at, v.source, l.status AS prev,
               CASE WHEN coalesce(l.provider, v.unnamed, v.source) IS DISTINCT FROM v.source THEN 'provider'
                    WHEN NOT (l.status IN ('sending', 'sent', 'unknown') OR l.attempt_count > 0
                              OR l.sent_at IS NOT NULL OR l.maybe_accepted
                              OR EXISTS (SELECT 1 FROM sms_attempts a
                                         WHERE a.outbox_id = v.id AND a.outcome NOT IN ('rate_limited', 'lookup'))) THEN 'unsent'
                    WHEN v.ref IS NOT NULL AND l.provider_ref IS NOT NULL AND v.ref <> l.provider_ref THEN 'reference'
               END AS refused
        FROM v JOIN locked l USING (id)
    ), ev AS (
        INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, code, reported_at, source)
        SELECT j.id, 'receipt', CASE j.status WHEN 'sent' THEN 'accepted' ELSE j.status END, j.ref, j.code, j.at, j.source
        FROM judged j
        -- A receipt sent again (a provider retrying) is recorded once, by
        -- one index lookup per receipt (see outbox.ApplyReceipts).
        LEFT JOIN LATERAL (SELECT true AS dup FROM sms_evidence e
            WHERE e.outbox_id = j.id AND e.kind = 'receipt' AND e.source = j.source
              AND e.result = CASE j.status WHEN 'sent' THEN 'accepted' ELSE j.status END
              AND e.provider_ref IS NOT DISTINCT FROM j.ref AND e.code IS NOT DISTINCT FROM j.code
              AND e.reported_at IS NOT DISTINCT FROM j.at
            LIMIT 1) seen ON true
        WHERE j.refused IS NULL AND seen.dup IS NULL
    ), upd AS (
        UPDATE sms_outbox o
        SET status = j.status, provider_ref = coalesce(o.provider_ref, j.ref), lookup_pending = false,
            sent_at = coalesce(o.sent_at, pg_catalog.clock_timestamp()), updated_at = pg_catalog.clock_timestamp()
        FROM judged j
        WHERE o.id = j.id AND j.refused IS NULL
          AND CASE WHEN j.status = 'sent' THEN j.prev IN ('pending', 'queued', 'sending', 'unknown')
                   ELSE j.prev IN ('pending', 'queued', 'sending', 'sent', 'unknown') END
        RETURNING o.id
    ), revived AS (
        -- A dead row follows its signed receipt (I7), and loses what said
        -- dead: its dead-letter reason, and its last error for a note.
        UPDATE sms_outbox o
        SET status = j.status, provider_ref = coalesce(o.provider_ref, j.ref), lookup_pending = false,
            end_reason = NULL,
            last_error = 'was dead, then a ' || j.source || ' receipt reported the message '
                         || CASE j.status WHEN 'sent' THEN 'accepted' ELSE j.status END || ': the provider had it',
            sent_at = coalesce(o.sent_at, pg_catalog.clock_timestamp()), updated_at = pg_catalog.clock_timestamp()
        FROM judged j
        WHERE o.id = j.id AND j.refused IS NULL AND j.prev = 'dead'
        RETURNING o.id
    )
    SELECT v.k, judged.prev, upd.id IS NOT NULL OR revived.id IS NOT NULL, judged.refused
    FROM v LEFT JOIN judged USING (id) LEFT JOIN upd USING (id) LEFT JOIN revived USING (id)
    ORDER BY v.k;
END;
$$;

DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = 'sms_outbox'::regclass);
    f text := 'sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[], text[])';
BEGIN
    EXECUTE format('ALTER FUNCTION %s OWNER TO %I', f, owner);
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
END $$;
GRANT EXECUTE ON FUNCTION sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[], text[])
    TO sendonce_receiver;
