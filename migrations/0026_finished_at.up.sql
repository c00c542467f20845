-- Retention rests on facts the purging role cannot write.
--
-- sendonce_purge deleted finished rows whose updated_at was older than the
-- cutoff, and dead rows whose letter_seq was set: the relay, which calls
-- it, may write both, and may itself move pending -> queued -> dead and
-- unknown -> dead (after clearing maybe_accepted, which it may write too).
-- A relay's login so purged, in one call, a pending row, an unknown row an
-- attempt may have reached, and a row delivered two minutes before.
--
-- 1. finished_at: when the row last moved into sent, delivered,
--    undelivered or dead, written by the database alone: the trigger
--    sms_outbox_finished on a move into sent, sms_outbox_forward_only on a
--    move into the others (which always run it), and cleared on a move out
--    of them. No component role holds a grant on the column, and each of
--    these moves sets it whatever the statement wrote. The purge keeps
--    every row that finished less than its cutoff (an hour at least) ago,
--    whatever its updated_at says.
-- 2. The relay ends only a row whose attempts are spent: its moves queued
--    or sending -> dead or unknown (the reconciler's Finalize, which makes
--    them only then) need attempt_count >= max_attempts, and the relay may
--    no longer write attempt_count (max_attempts it never could). Its one
--    write of it, a replay's fresh budget, is the trigger's now: every move
--    to pending sets attempt_count to 0. So the relay cannot finish a row
--    no sender ever claimed (which would then be purged an hour later).
-- 3. Unknown rows stay out of the purge, and dead rows need their letter
--    (letter_seq), as before. What the relay can still do, by design: write
--    letter_seq (the reconciler records the letters it publishes), and
--    settle an unknown row (relay resolve), which then finishes, and is
--    purged no sooner than the cutoff after that.
--
-- Rows that finished before this migration have no finish time. Each
-- finished at or before the migration, so once the migration is an hour
-- old (the floor) their last change stands for it, as before: no backfill
-- rewrites the finished rows of a large table, and retention goes on from
-- the first hour. The migration's time is read from
-- sendonce_schema_migrations, which the relay may read, not write. The
-- column and the triggers are made in one transaction, so no row finishes
-- between them without its time: the ALTER TABLE holds its lock (a catalog
-- change, no rewrite: a nullable column without a default) until commit.
--
-- The purge still reads sms_outbox_final_idx in updated_at order; honest
-- rows finish when they last change, so the extra condition drops none of
-- the rows it reads; a row whose updated_at a relay set back is read and
-- left. No index is added: finished_at is written with the status, and an
-- index on it would add an entry to every message.
--
-- Cost: the relay's and the receiver's finishing moves already ran
-- sms_outbox_forward_only; the sender's sent write, which its WHEN let
-- through without a call (0021), now runs sms_outbox_finished, a function
-- of one assignment, once a message: about 2 us (EXPLAIN ANALYZE of
-- 50,000 sending -> sent moves: the trigger's time 90-115 ms, the
-- statement 471-643 ms without it and 664-813 ms with it, four runs each
-- on a loaded 2-core host; the function's pinned search_path is half of
-- it: 43-63 ms unpinned).

ALTER TABLE sms_outbox ADD COLUMN IF NOT EXISTS finished_at timestamptz;

CREATE OR REPLACE FUNCTION sms_outbox_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.finished_at := pg_catalog.clock_timestamp();
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER sms_outbox_finished
    BEFORE UPDATE OF status ON sms_outbox
    FOR EACH ROW WHEN (NEW.status = 'sent' AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION sms_outbox_finished();

-- The moves of 0018, and: the relay's ends need spent attempts; every
-- move writes finished_at (a move into sent has it from
-- sms_outbox_finished, which fires first: triggers fire by name) and a
-- move to pending gives the attempts back. The WHEN of 0021 stays.
CREATE OR REPLACE FUNCTION sms_outbox_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    move text := OLD.status || ' -> ' || NEW.status;
BEGIN
    IF NEW.status IN ('delivered', 'undelivered', 'dead') THEN
        NEW.finished_at := pg_catalog.clock_timestamp();
    ELSIF NEW.status <> 'sent' THEN
        NEW.finished_at := NULL;
    END IF;
    IF NEW.status = 'pending' THEN
        NEW.attempt_count := 0;
    END IF;
    IF move IN ('pending -> sending', 'queued -> sending',
                'sending -> queued', 'sending -> dead', 'sending -> unknown',
                'unknown -> dead', 'dead -> unknown',
                'pending -> sent', 'queued -> sent', 'sending -> sent', 'unknown -> sent', 'dead -> sent',
                'pending -> delivered', 'queued -> delivered', 'sending -> delivered', 'unknown -> delivered', 'sent -> delivered',
                'pending -> undelivered', 'queued -> undelivered', 'sending -> undelivered', 'unknown -> undelivered', 'sent -> undelivered')
       AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF (move IN ('pending -> queued',
                 'unknown -> sent', 'unknown -> delivered', 'unknown -> undelivered', 'unknown -> dead',
                 'dead -> pending', 'unknown -> pending')
        OR (move IN ('queued -> dead', 'queued -> unknown', 'sending -> dead', 'sending -> unknown')
            AND NEW.attempt_count >= NEW.max_attempts))
       AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'sms_outbox: % may not move a row from % to %', current_user, OLD.status, NEW.status
        USING ERRCODE = 'check_violation',
              DETAIL = 'Statuses move forward only, and each move only by the component that makes it (migration 0018); the relay ends only a row whose attempts are spent (migration 0026).';
END;
$$;

CREATE OR REPLACE FUNCTION sendonce_purge(older_than interval, max_rows integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
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
    -- rows, and dead rows whose dead letter is stored, that finished at
    -- least older_than ago; never a pending, queued, sending or unknown
    -- row. Rows another purger holds are skipped.
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
    RETURN n;
END;
$$;

DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    EXECUTE format('ALTER FUNCTION sendonce_purge(interval, integer) OWNER TO %I', owner);
    EXECUTE format('ALTER FUNCTION sendonce_purge(interval, integer) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION sendonce_purge(interval, integer) FROM PUBLIC;
    FOREACH f IN ARRAY ARRAY['sms_outbox_forward_only()', 'sms_outbox_finished()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;

REVOKE UPDATE (attempt_count) ON sms_outbox FROM sendonce_relay;
