-- The console's replay locks only the rows it may replay.
--
-- sendonce_replay_rows locked every row a replay named, and
-- sendonce_console_replay every row named twice, before either looked at
-- a status: a console login that named pending, queued or sending rows
-- and kept its transaction open held them, so the relay's publication
-- (FOR UPDATE SKIP LOCKED) passed them over and the senders' claims waited
-- behind the lock until they timed out. Both waited as well for a row
-- another transaction held (a receipt, a sender's write).
--
-- Now both lock only dead rows (the only rows a console replay moves:
-- 0018), and skip a dead row another transaction holds (SKIP LOCKED)
-- instead of waiting for it. sendonce_replay_rows still returns every
-- named row, the ones it does not lock read without a lock, and says of a
-- dead row it could not lock that another transaction holds it (held):
-- outbox.Replay refuses that row, to be tried again. The return type
-- gains that column: the function is dropped and made again (a SELECT of
-- its four columns by name, as the console of the release before runs,
-- still works), and its owner, search_path and grant given again.
DROP FUNCTION sendonce_replay_rows(uuid[]);
CREATE FUNCTION sendonce_replay_rows(ids uuid[])
RETURNS TABLE (id uuid, status text, publish_gen integer, end_reason text, held boolean)
LANGUAGE sql SECURITY DEFINER AS $$
    WITH locked AS (
        SELECT o.id, o.status, o.publish_gen, o.end_reason FROM sms_outbox o
        WHERE o.id = ANY(ids) AND o.status = 'dead'
        ORDER BY o.id FOR NO KEY UPDATE SKIP LOCKED
    )
    SELECT l.id, l.status, l.publish_gen, l.end_reason, false FROM locked l
    UNION ALL
    SELECT o.id, o.status, o.publish_gen, o.end_reason, o.status = 'dead' FROM sms_outbox o
    WHERE o.id = ANY(ids) AND o.id NOT IN (SELECT l.id FROM locked l)
    ORDER BY 1
$$;

-- The second step locks the dead rows it may move, skipping held ones
-- (they are refused, and counted refused in the audit row).
CREATE OR REPLACE FUNCTION sendonce_console_replay(p_user text, p_role text, p_requested uuid[], p_ids uuid[], p_remote text)
RETURNS TABLE (audit_id bigint, audit_at timestamptz, replayed_rows uuid[])
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    moved uuid[];
BEGIN
    WITH locked AS (
        SELECT o.id FROM sms_outbox o
        WHERE o.id = ANY(p_ids) AND o.id = ANY(p_requested) AND o.status = 'dead'
        ORDER BY o.id FOR NO KEY UPDATE SKIP LOCKED
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

DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['sendonce_replay_rows(uuid[])', 'sendonce_console_replay(text, text, uuid[], uuid[], text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
GRANT EXECUTE ON FUNCTION sendonce_replay_rows(uuid[]) TO sendonce_console;
