-- Narrower grants. The relay deleted rows with a table-wide DELETE (a
-- pending row included) and held a DELETE on sms_attempts that the cascade
-- makes redundant; applications read status and last_error of every row.
-- Both now go through functions that run with the table owner's rights and
-- do one thing each: sendonce_purge deletes finished rows only, and
-- sendonce_status reads one row's status columns by its id (a random UUID
-- the application was given by the insert: knowing it is the right to read
-- it).
--
-- Each function pins its search_path (pg_catalog, the schema the tables are
-- in, then pg_temp) so that no caller can put a table or function of its
-- own in front of the real ones, and is owned by the table's owner.
-- Functions are executable by PUBLIC by default: that is revoked.

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
    -- The retention rule (docs/design.md): sent, delivered and undelivered
    -- rows, and dead rows whose dead letter is stored; never a pending,
    -- queued, sending or unknown row. Rows another purger holds are skipped.
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

CREATE OR REPLACE FUNCTION sendonce_status(message_id uuid)
RETURNS TABLE (id uuid, status text, attempt_count integer, provider_ref text, last_error text,
               created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT o.id, o.status, o.attempt_count, o.provider_ref, o.last_error, o.created_at, o.updated_at
    FROM sms_outbox o WHERE o.id = message_id
$$;

DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_class WHERE oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['sendonce_purge(interval, integer)', 'sendonce_status(uuid)'] LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;

GRANT EXECUTE ON FUNCTION sendonce_purge(interval, integer) TO sendonce_relay;
REVOKE DELETE ON sms_outbox FROM sendonce_relay;
REVOKE DELETE ON sms_attempts FROM sendonce_relay;

GRANT EXECUTE ON FUNCTION sendonce_status(uuid) TO sendonce_app;
-- A table-wide REVOKE takes the column grants of 0004, 0007 and 0008 too.
REVOKE SELECT ON sms_outbox FROM sendonce_app;
