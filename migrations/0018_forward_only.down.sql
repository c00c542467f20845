-- The grants of before 0018 back: the receiver and the console update the
-- table themselves (a release before 0018 does), the receiver records its
-- receipts and the console its audit; no trigger on status moves; purges
-- with any positive cutoff.
GRANT UPDATE (status, provider_ref, lookup_pending, updated_at, sent_at, end_reason, last_error)
    ON sms_outbox TO sendonce_receiver;
GRANT INSERT ON sms_evidence TO sendonce_receiver;
GRANT UPDATE (status, publish_gen, attempt_count, next_attempt_at, updated_at, stream_seq,
              claim_id, lease_until, end_reason, letter_seq, last_error)
    ON sms_outbox TO sendonce_console;
GRANT INSERT ON sendonce_console_audit TO sendonce_console;

DROP TRIGGER IF EXISTS sms_outbox_forward_only ON sms_outbox;
DROP FUNCTION IF EXISTS sms_outbox_forward_only();
DROP FUNCTION IF EXISTS sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[]);
DROP FUNCTION IF EXISTS sendonce_replay_rows(uuid[]);
DROP FUNCTION IF EXISTS sendonce_console_replay(text, text, uuid[], uuid[], text);

-- sendonce_purge as 0010 made it.
CREATE OR REPLACE FUNCTION sendonce_purge(older_than interval, max_rows integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
BEGIN
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'sendonce_purge: older_than must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'sendonce_purge: max_rows must be 1 to 10000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM sms_outbox WHERE id IN (
        SELECT id FROM sms_outbox
        WHERE status IN ('sent', 'delivered', 'undelivered', 'dead') AND updated_at < now() - older_than
          AND (status <> 'dead' OR letter_seq IS NOT NULL)
        ORDER BY updated_at
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION sendonce_purge(interval, integer) SET search_path = pg_catalog, %I, pg_temp', current_schema());
END $$;
