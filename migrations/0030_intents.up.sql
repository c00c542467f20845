-- sendonce:no-transaction
-- One intent, on time, cancellable. A user sees intents and time, not
-- rows: a form posted twice must send one code, a code written before an
-- outage must not be delivered after it expired, a reminder must wait for
-- its hour, and an order cancelled must take its message back. Three
-- columns an application may write at INSERT, part of the intent like the
-- number and the body (immutable afterwards, migration 0031), and four
-- statuses:
--
--   idempotency_key  the application's own name for the intent: at most
--                    one row per key, by a unique index (a plain INSERT ...
--                    ON CONFLICT DO NOTHING with a used key writes
--                    nothing); sendonce_enqueue writes the row or returns
--                    the one the key names, refusing another number or
--                    body. A key lives as long as its row: retention
--                    purges finished rows, and their keys with them.
--   send_at          no provider call before it: a row written with a
--                    future send_at is 'scheduled', and the relay makes it
--                    'pending' once it is due. A scheduled row is in no
--                    index the pipeline reads (not the relay's pending
--                    index, not the in-flight one): a million of them cost
--                    today's traffic nothing but their own index.
--   expires_at       no provider call at or after it: a row that reaches
--                    it with no call that may have been taken ends
--                    'expired' (decided by the sender's claim and by the
--                    relay's sweep); one a call may have reached is
--                    settled by evidence, as before.
--
--   scheduled        waiting for send_at (not terminal)
--   expired          never sent: its expiry came first (final)
--   cancelled        never sent: the application took it back with
--                    sendonce_cancel before any call started (final)
--   suppressed       never sent: its number is on the suppression list
--                    (final)
--
-- A no-transaction file: each statement runs on its own and may run
-- again (IF NOT EXISTS, catalog checks), so that the index builds run
-- CONCURRENTLY and the status check is validated without a lock that
-- stops the applications' inserts.

-- Plain columns: a column of a domain with a check would make Postgres
-- rewrite the whole table under its strongest lock (to check the NULL of
-- every existing row). The key's format is checked at the insert
-- (sms_outbox_intent, below), and no update may change it (0031).
ALTER TABLE sms_outbox
    ADD COLUMN IF NOT EXISTS idempotency_key text,
    ADD COLUMN IF NOT EXISTS send_at timestamptz,
    ADD COLUMN IF NOT EXISTS expires_at timestamptz;

-- The statuses: the check of 0001 gives way to one that knows the new
-- ones, added NOT VALID (a catalog change), validated apart (a scan that
-- lets writes go on; every row passes, the new list holds the old), and
-- renamed to the old name once the old check is gone.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_known')
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_valid'
                     AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%scheduled%') THEN
        ALTER TABLE sms_outbox ADD CONSTRAINT sms_outbox_status_known CHECK (status IN (
            'pending', 'scheduled', 'queued', 'sending', 'sent', 'delivered', 'undelivered',
            'dead', 'unknown', 'expired', 'cancelled', 'suppressed')) NOT VALID;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_known' AND NOT convalidated) THEN
        ALTER TABLE sms_outbox VALIDATE CONSTRAINT sms_outbox_status_known;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_outbox'::regclass AND conname = 'sms_outbox_status_known') THEN
        ALTER TABLE sms_outbox DROP CONSTRAINT IF EXISTS sms_outbox_status_valid;
        ALTER TABLE sms_outbox RENAME CONSTRAINT sms_outbox_status_known TO sms_outbox_status_valid;
    END IF;
END $$;

-- The attempts log records an expiry decided at a claim ('expired'), as it
-- records the other decisions made without a call: the same three steps.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_known')
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_check'
                     AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%expired%') THEN
        ALTER TABLE sms_attempts ADD CONSTRAINT sms_attempts_outcome_known CHECK (outcome IN (
            'sent', 'retry', 'rate_limited', 'lookup', 'permanent', 'ambiguous', 'max_attempts', 'expired')) NOT VALID;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_known' AND NOT convalidated) THEN
        ALTER TABLE sms_attempts VALIDATE CONSTRAINT sms_attempts_outcome_known;
    END IF;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = 'sms_attempts'::regclass AND conname = 'sms_attempts_outcome_known') THEN
        ALTER TABLE sms_attempts DROP CONSTRAINT IF EXISTS sms_attempts_outcome_check;
        ALTER TABLE sms_attempts RENAME CONSTRAINT sms_attempts_outcome_known TO sms_attempts_outcome_check;
    END IF;
END $$;

-- At most one row per key. The index holds keyed rows only. Built
-- concurrently; a build that failed part-way leaves an invalid index of
-- this name, dropped first.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_idempotency_key;
CREATE UNIQUE INDEX CONCURRENTLY sms_outbox_idempotency_key ON sms_outbox (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The relay's promotion of due scheduled rows reads this index's first
-- entries; nothing else reads a scheduled row.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_scheduled_idx;
CREATE INDEX CONCURRENTLY sms_outbox_scheduled_idx ON sms_outbox (send_at) WHERE status = 'scheduled';

-- The relay's expiry sweep: rows with an expiry that no one has claimed.
-- A row without expires_at (most) never has an entry.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_expiring_idx;
CREATE INDEX CONCURRENTLY sms_outbox_expiring_idx ON sms_outbox (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('scheduled', 'pending', 'queued');

-- Retention's second index: the rows finished without a call (expired,
-- cancelled, suppressed), by their last change, as sms_outbox_final_idx
-- holds the sent and dead ones. The console counts them from it too.
DROP INDEX CONCURRENTLY IF EXISTS sms_outbox_unsent_idx;
CREATE INDEX CONCURRENTLY sms_outbox_unsent_idx ON sms_outbox (updated_at) INCLUDE (status)
    WHERE status IN ('expired', 'cancelled', 'suppressed');

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
    IF got IS NULL THEN
        -- No key, or its row is gone again (purged, or its writer rolled
        -- back after the INSERT waited): the conflict was another one.
        RAISE EXCEPTION 'sendonce_enqueue: the message could not be written (a conflict on its id, or its key''s row vanished meanwhile): try again'
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
    WITH ins AS (
        INSERT INTO sms_outbox AS o (id, to_e164, body, priority, idempotency_key, send_at, expires_at)
        SELECT v.id, v.t, v.b, coalesce(v.p, 2), v.k, v.s, v.e
        FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_tos), pg_catalog.unnest(p_bodies),
                        pg_catalog.unnest(p_keys), pg_catalog.unnest(p_priorities), pg_catalog.unnest(p_send_ats),
                        pg_catalog.unnest(p_expires)) WITH ORDINALITY AS v(id, t, b, k, p, s, e, n)
        ORDER BY v.n
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

-- As in 0018: each function owned by the table's owner, its search_path
-- pinned (pg_catalog, the tables' schema, pg_temp), no EXECUTE for PUBLIC.
DO $$
DECLARE
    owner name := (SELECT c.relowner::regrole::name FROM pg_catalog.pg_class c WHERE c.oid = 'sms_outbox'::regclass);
    f text;
BEGIN
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
