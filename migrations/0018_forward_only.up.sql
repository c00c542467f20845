-- Forward-only statuses, enforced by the database (I3 of docs/design.md).
-- Until now the rule lived in the components' statements only: a
-- receiver's login could UPDATE a delivered row back to pending (and the
-- row was sent again) or a dead row to delivered, and a console's login
-- could change status and publish_gen outside its audit trail. Now:
--
-- 1. The receiver and the console have no UPDATE on sms_outbox. They act
--    through functions that run with the table owner's rights and make
--    only their own moves: sendonce_apply_receipts (the receiver's
--    receipts, as outbox.ApplyReceipts wrote them) and, for the console,
--    sendonce_replay_rows (reads and locks the rows a replay names) and
--    sendonce_console_replay (puts dead or unknown rows without evidence
--    that the provider has their message back to pending, and records the
--    replay in sendonce_console_audit in the same statement; the console
--    may no longer write that table itself, so every audit row is a replay
--    the database made, and every console replay has its row).
-- 2. A trigger refuses, to every role but the table's owner, any status
--    move that no component makes. The owner is exempt: migrations, and
--    the functions above (SECURITY DEFINER, owned by the table's owner,
--    so they run as it), which keep their own rules.
-- 3. sendonce_purge keeps finished rows for an hour at least, whatever
--    cutoff it is given.
--
-- The trigger lets a move through when the role running the statement has
-- the privileges of a component role that makes it (pg_has_role USAGE: a
-- login IN ROLE sendonce_relay, or a session SET ROLE to it), or is a
-- member of the table's owner, read from pg_class when the trigger runs.
-- Not the name of the role that ran this migration, captured now: on
-- managed Postgres the migrating login is often a member of an owner role
-- rather than the owner, and the table may change owner later; a member of
-- the owner may become it (SET ROLE) and disable the trigger anyway, so
-- exempting it protects nothing less. A superuser is a member of every
-- role. Same status to same status is no move: the trigger does not even
-- run (its WHEN), so the writes that leave the status alone (claims run
-- again, republications, marks, letters, refunds) cost nothing more.
--
-- Every move a component makes, from its statements (internal/outbox):
--
--   sendonce_relay (no other role's moves):
--     pending -> queued                   MarkQueued (the relay's publish)
--     queued, sending -> dead, unknown    Finalize (the reconciler ends a
--                                         stuck row whose attempts are spent)
--     unknown -> sent, delivered,         Settle (relay resolve: a lookup
--                undelivered, dead        settles an unknown row)
--     dead, unknown -> pending            Replay (relay dlq replay)
--     (MarkRepublished, MarkLettered, ClaimStuck: no status change)
--   sendonce_sender:
--     pending, queued -> sending          ClaimForSend (sending -> sending:
--                                         a stale or own claim, no move)
--     sending -> queued, dead, unknown    ApplyResults, fenced on the claim
--                                         (a retry, a dead or unknown end)
--     unknown -> dead                     ApplyResults: a claim's lookup
--                                         found no message
--     dead -> unknown                     ApplyResults: a dead write of the
--                                         claim over its own dead row, when
--                                         an attempt may have reached the
--                                         provider (toward caution)
--     pending, queued, sending,           ApplyResults: the provider's
--       unknown, dead -> sent             answer (over dead: a lost answer
--                                         contradicts a later guess)
--     pending, queued, sending,           ApplyResults (a lookup found the
--       unknown, sent -> delivered,       provider's report) and
--       undelivered                       RecordOverdueLooks (the overdue
--                                         sweep, from sent)
--     (markMissed, refundMissed, countMissed, MarkOverdue, ClaimOverdue,
--      ReleaseOverdue, MarkLettered: no status change)
--   sendonce_receiver: none directly; through sendonce_apply_receipts:
--     pending, queued, sending, unknown, dead -> sent
--     pending, queued, sending, sent, unknown, dead -> delivered, undelivered
--     (over dead: the provider's signed word that it had the message, I7)
--   sendonce_console: none directly; through sendonce_console_replay:
--     dead -> pending (never unknown: see the function)
--   sendonce_app: no UPDATE at all.
--   retention (sendonce_purge, the relay): deletes finished rows, no move.
--
-- Refused to every role but the owner, for instance: anything out of
-- delivered or undelivered; sent to pending, queued, sending, dead or
-- unknown; dead to delivered or undelivered (only a receipt does that,
-- through its function); pending to dead or unknown; a replay by the
-- sender; pending to sent or delivered by the relay.
--
-- id, to_e164, body and priority were already immutable for every role,
-- the owner included (sms_outbox_immutable_intent, 0001 and 0007).
--
-- Upgrades: the receivers and the console of an earlier release update the
-- table themselves and are refused from this migration on (a receipt is
-- answered 500 and the provider sends it again; a console replay fails
-- and changes nothing): roll them with the migration.

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

CREATE OR REPLACE TRIGGER sms_outbox_forward_only
    BEFORE UPDATE OF status ON sms_outbox
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION sms_outbox_forward_only();

-- The receiver's receipts: the statement outbox.ApplyReceipts ran itself
-- until now, unchanged. $1 ids (no id twice), $2 statuses (sent,
-- delivered or undelivered), $3 provider refs, $4 codes, $5 reported
-- times, $6 sources; per receipt, in input order: the row's status before
-- and whether the receipt moved it.
CREATE OR REPLACE FUNCTION sendonce_apply_receipts(ids uuid[], statuses text[], refs text[], codes integer[],
                                                   reported timestamptz[], sources text[])
RETURNS TABLE (receipt bigint, prev_status text, moved boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(statuses) OR cardinality(ids) IS DISTINCT FROM cardinality(refs)
       OR cardinality(ids) IS DISTINCT FROM cardinality(codes) OR cardinality(ids) IS DISTINCT FROM cardinality(reported)
       OR cardinality(ids) IS DISTINCT FROM cardinality(sources) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: one status, ref, code, time and source per id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(statuses) AS s(status) WHERE s.status IS NULL OR s.status NOT IN ('sent', 'delivered', 'undelivered')) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: a receipt reports sent, delivered or undelivered'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT u) FROM unnest(ids) AS u) <> cardinality(ids) THEN
        RAISE EXCEPTION 'sendonce_apply_receipts: one receipt per row in a call'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH v AS (
        SELECT * FROM unnest(ids, statuses, refs, codes, reported, sources)
                 WITH ORDINALITY AS v(id, status, ref, code, at, source, k)
    ), locked AS (
        SELECT o.id, o.status FROM sms_outbox o WHERE o.id = ANY(ids) ORDER BY o.id FOR NO KEY UPDATE
    ), ev AS (
        INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, code, reported_at, source)
        SELECT v.id, 'receipt', CASE v.status WHEN 'sent' THEN 'accepted' ELSE v.status END, v.ref, v.code, v.at, v.source
        FROM v JOIN locked USING (id)
        -- A receipt sent again (a provider retrying) is recorded once, by
        -- one index lookup per receipt (see outbox.ApplyReceipts).
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
            sent_at = coalesce(o.sent_at, clock_timestamp()), updated_at = clock_timestamp()
        FROM v JOIN locked USING (id)
        WHERE o.id = v.id
          AND CASE WHEN v.status = 'sent' THEN locked.status IN ('pending', 'queued', 'sending', 'unknown')
                   ELSE locked.status IN ('pending', 'queued', 'sending', 'sent', 'unknown') END
        RETURNING o.id
    ), revived AS (
        -- A dead row follows its signed receipt (I7), and loses what said
        -- dead: its dead-letter reason, and its last error for a note.
        UPDATE sms_outbox o
        SET status = v.status, provider_ref = coalesce(o.provider_ref, v.ref), lookup_pending = false,
            end_reason = NULL,
            last_error = 'was dead, then a ' || v.source || ' receipt reported the message '
                         || CASE v.status WHEN 'sent' THEN 'accepted' ELSE v.status END || ': the provider had it',
            sent_at = coalesce(o.sent_at, clock_timestamp()), updated_at = clock_timestamp()
        FROM v JOIN locked USING (id)
        WHERE o.id = v.id AND locked.status = 'dead'
        RETURNING o.id
    )
    SELECT v.k, locked.status, upd.id IS NOT NULL OR revived.id IS NOT NULL
    FROM v LEFT JOIN locked USING (id) LEFT JOIN upd USING (id) LEFT JOIN revived USING (id)
    ORDER BY v.k;
END;
$$;

-- The console's replay, first step: the rows a replay names, read and
-- locked until the transaction ends (a lock needs an UPDATE grant, which
-- the console no longer has), so that its decision (outbox.Replay: stale
-- letters, evidence, unknown rows) holds when the second step writes it.
CREATE OR REPLACE FUNCTION sendonce_replay_rows(ids uuid[])
RETURNS TABLE (id uuid, status text, publish_gen integer, end_reason text)
LANGUAGE sql SECURITY DEFINER AS $$
    SELECT o.id, o.status, o.publish_gen, o.end_reason FROM sms_outbox o
    WHERE o.id = ANY(ids) ORDER BY o.id FOR NO KEY UPDATE
$$;

-- The console's replay, second step: each of p_ids (among p_requested)
-- that is dead or unknown and has no evidence that the provider may have
-- its message (a receipt, or a lookup that found it: the console never
-- forces) goes back to pending, as outbox.Replay writes a replay, and the
-- replay is recorded in the audit table: who, what was asked, what was
-- done. Returns the audit row's id and time and the rows replayed, in the
-- order of p_ids.
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
            next_attempt_at = now(), updated_at = now(), stream_seq = NULL,
            claim_id = NULL, lease_until = NULL, end_reason = NULL, letter_seq = NULL,
            last_error = 'replayed by operator; before: ' || coalesce(o.last_error, '')
        FROM locked
        -- Dead rows only: the provider never took them (the table refuses
        -- dead with maybe_accepted). Whether an unknown row is safe to send
        -- again depends on the provider's idempotency, which the row does
        -- not record: a console login could otherwise send such a row
        -- twice, whatever the console itself checks. Unknown rows are for
        -- relay dlq replay, after relay trace.
        WHERE o.id = locked.id AND o.status = 'dead' AND NOT o.maybe_accepted
          AND NOT EXISTS (SELECT 1 FROM sms_evidence e WHERE e.outbox_id = o.id
                          AND (e.kind = 'receipt' OR (e.kind = 'lookup' AND e.result IN ('found', 'several'))))
        RETURNING o.id
    )
    SELECT coalesce(array_agg(t.u ORDER BY t.k), '{}') INTO moved
    FROM (SELECT DISTINCT ON (x.u) x.u, x.k FROM unnest(p_ids) WITH ORDINALITY AS x(u, k) ORDER BY x.u, x.k) t
    WHERE t.u IN (SELECT upd.id FROM upd);
    INSERT INTO sendonce_console_audit (username, role, action, requested, replayed, refused, remote)
    VALUES (p_user, p_role, 'replay', p_requested, moved, cardinality(p_requested) - cardinality(moved), p_remote)
    RETURNING sendonce_console_audit.id, sendonce_console_audit.at INTO audit_id, audit_at;
    replayed_rows := moved;
    RETURN NEXT;
END;
$$;

-- Retention keeps finished rows for an hour at least: a relay's login (or
-- a relay misconfigured) cannot purge a row finished seconds ago, whose
-- receipt, trace or dead letter someone may still need. The relay itself
-- refuses an OUTBOX_RETENTION shorter than the work stream's max_age (a
-- day), and relay.NewRetention an Age under this floor.
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

-- As in 0010: each function owned by the table's owner, its search_path
-- pinned (pg_catalog, the tables' schema, pg_temp), no EXECUTE for PUBLIC.
-- sendonce_purge is here again because CREATE OR REPLACE resets a
-- function's settings; its owner and grants stay.
DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_class WHERE oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['sms_outbox_forward_only()',
                             'sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[])',
                             'sendonce_replay_rows(uuid[])',
                             'sendonce_console_replay(text, text, uuid[], uuid[], text)',
                             'sendonce_purge(interval, integer)'] LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;

-- The receiver: receipts only through its function. It keeps reading a
-- row's id, status and provider id, and the receipts.
REVOKE UPDATE ON sms_outbox FROM sendonce_receiver;
REVOKE INSERT ON sms_evidence FROM sendonce_receiver;
GRANT EXECUTE ON FUNCTION sendonce_apply_receipts(uuid[], text[], text[], integer[], timestamptz[], text[]) TO sendonce_receiver;

-- The console: replays only through its functions, each recorded. It
-- keeps reading every column but the number and the body, and the audit.
REVOKE UPDATE ON sms_outbox FROM sendonce_console;
REVOKE INSERT ON sendonce_console_audit FROM sendonce_console;
GRANT EXECUTE ON FUNCTION sendonce_replay_rows(uuid[]) TO sendonce_console;
GRANT EXECUTE ON FUNCTION sendonce_console_replay(text, text, uuid[], uuid[], text) TO sendonce_console;
