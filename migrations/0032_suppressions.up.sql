-- One suppression list for every provider (docs/consent.md).
--
-- A recipient who replies STOP to one provider's number is blocked there,
-- and only there: the next message, moved to another provider of
-- SMS_PROVIDERS, reached the person who opted out. sendonce sees every
-- provider, so it keeps one list, and no provider is called for a number
-- on it: the row ends 'suppressed' (0030's status), decided where the
-- row is claimed, in the claim's own statement, and skipped by this
-- table's trigger for any claim that skips the rule (a stolen sender
-- login included).
--
-- sms_suppressions holds a number (the domain of sms_outbox.to_e164,
-- whose check names no value), why (reason, a short text with digit runs
-- masked), where it came from (source: inbound, a STOP the provider
-- forwarded; refusal, a provider's opted-out answer to a send; receipt,
-- a delivery receipt with an opted-out code; operator; import; app) and
-- from which provider, who added it and when. Nothing else: the text of
-- an inbound message is never stored. seq orders the list for pages.
-- sms_suppression_removals keeps each removal with who removed it and
-- why, and what the entry said.
--
-- Every write goes through a function that runs with the owner's
-- rights (no role may write either table itself), each granted to the
-- component that makes that write:
--   sendonce_suppress             the application (sendonce_app): adds
--                                 a number (an "unsubscribe" link), never
--                                 removes one
--   sendonce_suppress_rows        the sender (a refusal) and the
--                                 receiver (a receipt): adds the numbers
--                                 of rows by their ids
--   sendonce_suppress_inbound     the receiver: a STOP adds, a START
--                                 lifts an entry the recipient's own acts
--                                 made (inbound, refusal, receipt, app),
--                                 never an operator's or an import's
--   sendonce_suppress_add         operators (relay suppress add, import)
--   sendonce_suppress_remove      operators (relay suppress remove): who
--                                 and why are required and recorded
--   sendonce_console_suppress     the console: adds or removes, and
--                                 writes the audit row in the same
--                                 statement
-- and reads of a number's entry (sendonce_suppression_check,
-- sendonce_suppression_removed, sendonce_suppression_of for a row's
-- number) and the masked list (sms_suppressions_masked) for operators.
-- The sender reads the list itself: its claim joins it.
--
-- The forward-only trigger (0031) learns the list:
-- 1. a claim (any move into sending, by any role but the owner) of a row
--    whose number is on the list and that no earlier attempt may have
--    reached is skipped (the row is left as it is, as for a row not yet
--    due or past its expiry, 0031): the senders' claim ends such a row
--    suppressed itself, so this stops only a statement that skipped the
--    rule, or a claim that read the list a moment before a STOP
--    committed (its next claim ends the row). A row an earlier attempt
--    may have reached is still claimed, to be looked up and never called
--    (the sender's rule, as for expiry). Evidence moves a suppressed row
--    to sent, delivered or undelivered, as an expired one (0031).
-- 2. the sender's moves pending, queued -> suppressed (its claim: the
--    number on the list, no mark of doubt) and sending -> suppressed (a
--    provider refused the call as opted out, or a lookup found that no
--    earlier attempt reached it); any move into suppressed needs the
--    number on the list, and never a row an attempt may have reached
--    (0031 refuses suppressed with maybe_accepted).
-- The function reads the list, so its search_path now holds the tables'
-- schema too (pg_catalog first, as the definer functions'; relay migrate
-- refuses a schema others may create in).

CREATE TABLE IF NOT EXISTS sms_suppressions (
    number   sendonce_e164 PRIMARY KEY,
    seq      bigint GENERATED ALWAYS AS IDENTITY,
    source   text NOT NULL,
    provider text,
    reason   text NOT NULL DEFAULT '',
    added_by text NOT NULL DEFAULT '',
    added_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
CREATE UNIQUE INDEX IF NOT EXISTS sms_suppressions_seq ON sms_suppressions (seq);
-- The claim probes the list's key when the planner knows the list is
-- large, and reads its page or two when it is small; statistics that lag
-- behind a growing list would keep the read (a plan reused by a busy
-- sender's connection is made again when they change). So they follow
-- closely, and an import brings them up to date at its end
-- (sendonce_suppression_analyze).
ALTER TABLE sms_suppressions SET (autovacuum_analyze_threshold = 100, autovacuum_analyze_scale_factor = 0.02);

CREATE TABLE IF NOT EXISTS sms_suppression_removals (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    number         sendonce_e164 NOT NULL,
    added_source   text NOT NULL,
    added_provider text,
    added_reason   text NOT NULL,
    added_by       text NOT NULL,
    added_at       timestamptz NOT NULL,
    removed_at     timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    removed_by     text NOT NULL,
    removed_via    text NOT NULL,
    reason         text NOT NULL
);
CREATE INDEX IF NOT EXISTS sms_suppression_removals_number ON sms_suppression_removals (number);

-- What the console did besides replays (a number added or removed): the
-- masked number and the reason.
ALTER TABLE sendonce_console_audit ADD COLUMN IF NOT EXISTS detail text;

-- The masked number, as sms_outbox_masked shows a row's.
CREATE OR REPLACE FUNCTION sendonce_mask_number(n text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN pg_catalog.length(n) < 5 THEN '+***'
                ELSE pg_catalog.left(n, 2) || pg_catalog.repeat('*', pg_catalog.length(n) - 4) || pg_catalog.right(n, 2)
           END
$$;

-- A reason or a name as stored: trimmed, at most 200 characters, control
-- characters dropped, and every run of seven or more digits (with up to
-- three separators between them: a phone number however it is written)
-- masked "#". A provider's error code (four or five digits) stays.
CREATE OR REPLACE FUNCTION sendonce_suppression_text(t text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.left(pg_catalog.btrim(pg_catalog.regexp_replace(pg_catalog.regexp_replace(
               coalesce(t, ''), '[[:cntrl:]]', ' ', 'g'), '[0-9]([^[:alnum:]]{0,3}[0-9]){6,}', '#', 'g')), 200)
$$;

-- A number given to a function: E.164, or refused without the value.
CREATE OR REPLACE FUNCTION sendonce_suppression_number(n text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF n IS NULL OR n !~ '^\+[1-9][0-9]{1,14}$' THEN
        RAISE EXCEPTION 'sms_suppressions: a number is "+" and 2 to 15 digits, the first not 0 (E.164)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END;
$$;

CREATE OR REPLACE VIEW sms_suppressions_masked AS
SELECT s.seq, sendonce_mask_number(s.number) AS number_masked, s.source, s.provider, s.reason, s.added_by, s.added_at
FROM sms_suppressions s;

-- The application's unsubscribe: adds the number (source app, by the
-- session's login); true when it was not on the list.
CREATE OR REPLACE FUNCTION sendonce_suppress(p_number text, p_reason text DEFAULT '') RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
BEGIN
    INSERT INTO sms_suppressions (number, source, reason, added_by, added_at)
    VALUES (sendonce_suppression_number(p_number), 'app', sendonce_suppression_text(p_reason),
            sendonce_suppression_text(session_user::text), pg_catalog.clock_timestamp())
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END;
$$;

-- The numbers of rows (by id) a provider reported opted out: a refusal of
-- a send (the sender) or a receipt's code (the receiver). Numbers are
-- added in their order, so that two writers never wait for each other
-- the other way round. Returns how many were added.
CREATE OR REPLACE FUNCTION sendonce_suppress_rows(p_ids uuid[], p_source text, p_providers text[], p_reasons text[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
BEGIN
    IF p_source IS NULL OR p_source NOT IN ('refusal', 'receipt') THEN
        RAISE EXCEPTION 'sendonce_suppress_rows: source must be refusal or receipt' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_providers)
       OR pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_reasons) THEN
        RAISE EXCEPTION 'sendonce_suppress_rows: one provider and one reason per id' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO sms_suppressions (number, source, provider, reason, added_by, added_at)
    SELECT DISTINCT ON (o.to_e164) o.to_e164, p_source, sendonce_suppression_text(v.p), sendonce_suppression_text(v.r),
           sendonce_suppression_text(session_user::text), pg_catalog.clock_timestamp()
    FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_providers), pg_catalog.unnest(p_reasons)) AS v(id, p, r)
    JOIN sms_outbox o ON o.id = v.id
    ORDER BY o.to_e164
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- An inbound STOP (p_lift false) adds the number, from p_provider; a
-- START (p_lift true) lifts an entry the recipient's own acts made
-- (inbound, refusal, receipt, app), recording the removal with the
-- provider as who and the keyword as why. Returns suppressed, lifted,
-- unchanged (already on the list; or not on it), or kept (a START for an
-- entry an operator or an import made, which only an operator lifts).
CREATE OR REPLACE FUNCTION sendonce_suppress_inbound(p_number text, p_provider text, p_keyword text, p_lift boolean)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    num text := sendonce_suppression_number(p_number);
    prov text := sendonce_suppression_text(p_provider);
    kw text := pg_catalog.upper(sendonce_suppression_text(p_keyword));
    n bigint;
BEGIN
    IF prov = '' THEN
        RAISE EXCEPTION 'sendonce_suppress_inbound: the provider is required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT p_lift THEN
        INSERT INTO sms_suppressions (number, source, provider, reason, added_by, added_at)
        VALUES (num, 'inbound', prov, kw, prov, pg_catalog.clock_timestamp())
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS n = ROW_COUNT;
        RETURN CASE WHEN n > 0 THEN 'suppressed' ELSE 'unchanged' END;
    END IF;
    WITH gone AS (
        DELETE FROM sms_suppressions s
        WHERE s.number OPERATOR(pg_catalog.=) num AND s.source IN ('inbound', 'refusal', 'receipt', 'app')
        RETURNING s.*
    )
    INSERT INTO sms_suppression_removals (number, added_source, added_provider, added_reason, added_by, added_at,
                                          removed_at, removed_by, removed_via, reason)
    SELECT g.number, g.source, g.provider, g.reason, g.added_by, g.added_at,
           pg_catalog.clock_timestamp(), prov, 'inbound', 'the recipient sent ' || kw
    FROM gone g;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        RETURN 'lifted';
    END IF;
    IF EXISTS (SELECT 1 FROM sms_suppressions s WHERE s.number OPERATOR(pg_catalog.=) num) THEN
        RETURN 'kept';
    END IF;
    RETURN 'unchanged';
END;
$$;

-- An operator's addition (source operator) or an import's (source
-- import), by p_by, of every number of p_numbers not on the list yet, in
-- their order. Returns how many were added.
CREATE OR REPLACE FUNCTION sendonce_suppress_add(p_numbers text[], p_source text, p_reason text, p_by text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
    bad bigint;
BEGIN
    IF p_source IS NULL OR p_source NOT IN ('operator', 'import') THEN
        RAISE EXCEPTION 'sendonce_suppress_add: source must be operator or import' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF sendonce_suppression_text(p_by) = '' THEN
        RAISE EXCEPTION 'sendonce_suppress_add: who adds the numbers is required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT pg_catalog.count(*) INTO bad FROM pg_catalog.unnest(p_numbers) AS u(n)
    WHERE u.n IS NULL OR u.n !~ '^\+[1-9][0-9]{1,14}$';
    IF bad > 0 THEN
        RAISE EXCEPTION 'sendonce_suppress_add: % of the numbers are not E.164 ("+" and 2 to 15 digits, the first not 0)', bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO sms_suppressions (number, source, reason, added_by, added_at)
    SELECT DISTINCT u.n, p_source, sendonce_suppression_text(p_reason), sendonce_suppression_text(p_by), pg_catalog.clock_timestamp()
    FROM pg_catalog.unnest(p_numbers) AS u(n)
    ORDER BY u.n
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- An operator's removal: who and why are required, and recorded with
-- what the entry said. p_via names the tool (operator: relay suppress;
-- console). Returns whether the number was on the list.
CREATE OR REPLACE FUNCTION sendonce_suppress_remove(p_number text, p_by text, p_reason text, p_via text DEFAULT 'operator')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    num text := sendonce_suppression_number(p_number);
    n bigint;
BEGIN
    IF sendonce_suppression_text(p_by) = '' OR sendonce_suppression_text(p_reason) = '' THEN
        RAISE EXCEPTION 'sendonce_suppress_remove: who removes the number and why are required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_via IS NULL OR p_via NOT IN ('operator', 'console') THEN
        RAISE EXCEPTION 'sendonce_suppress_remove: via must be operator or console' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH gone AS (
        DELETE FROM sms_suppressions s WHERE s.number OPERATOR(pg_catalog.=) num RETURNING s.*
    )
    INSERT INTO sms_suppression_removals (number, added_source, added_provider, added_reason, added_by, added_at,
                                          removed_at, removed_by, removed_via, reason)
    SELECT g.number, g.source, g.provider, g.reason, g.added_by, g.added_at,
           pg_catalog.clock_timestamp(), sendonce_suppression_text(p_by), p_via, sendonce_suppression_text(p_reason)
    FROM gone g;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END;
$$;

-- The console's addition or removal and its audit row, in one statement:
-- the console's role may do neither alone.
CREATE OR REPLACE FUNCTION sendonce_console_suppress(p_user text, p_role text, p_action text, p_number text, p_reason text, p_remote text)
RETURNS TABLE (audit_id bigint, audit_at timestamptz, changed boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    num text := sendonce_suppression_number(p_number);
    did boolean;
BEGIN
    IF p_action = 'suppress' THEN
        did := sendonce_suppress_add(ARRAY[num], 'operator', p_reason, p_user) > 0;
    ELSIF p_action = 'unsuppress' THEN
        did := sendonce_suppress_remove(num, p_user, p_reason, 'console');
    ELSE
        RAISE EXCEPTION 'sendonce_console_suppress: action must be suppress or unsuppress' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO sendonce_console_audit (username, role, action, requested, replayed, refused, remote, detail)
    VALUES (p_user, p_role, p_action, '{}', '{}', CASE WHEN did THEN 0 ELSE 1 END, p_remote,
            sendonce_mask_number(num) || ': ' || sendonce_suppression_text(p_reason))
    RETURNING sendonce_console_audit.id, sendonce_console_audit.at INTO audit_id, audit_at;
    changed := did;
    RETURN NEXT;
END;
$$;

-- Statistics of the list brought up to date at once, after an import
-- (see the table's autovacuum settings above).
CREATE OR REPLACE FUNCTION sendonce_suppression_analyze() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    ANALYZE sms_suppressions;
END;
$$;

-- A number's entry, its number masked; no row when it is not on the list.
CREATE OR REPLACE FUNCTION sendonce_suppression_check(p_number text)
RETURNS TABLE (seq bigint, number_masked text, source text, provider text, reason text, added_by text, added_at timestamptz)
LANGUAGE sql SECURITY DEFINER STABLE AS $$
    SELECT s.seq, sendonce_mask_number(s.number), s.source, s.provider, s.reason, s.added_by, s.added_at
    FROM sms_suppressions s WHERE s.number OPERATOR(pg_catalog.=) sendonce_suppression_number(p_number)
$$;

-- A number's past removals, newest first.
CREATE OR REPLACE FUNCTION sendonce_suppression_removed(p_number text)
RETURNS TABLE (added_source text, added_provider text, added_reason text, added_by text, added_at timestamptz,
               removed_at timestamptz, removed_by text, removed_via text, reason text)
LANGUAGE sql SECURITY DEFINER STABLE AS $$
    SELECT r.added_source, r.added_provider, r.added_reason, r.added_by, r.added_at, r.removed_at, r.removed_by, r.removed_via, r.reason
    FROM sms_suppression_removals r WHERE r.number OPERATOR(pg_catalog.=) sendonce_suppression_number(p_number)
    ORDER BY r.removed_at DESC LIMIT 100
$$;

-- The entry of a row's number (relay trace, the console's message page).
CREATE OR REPLACE FUNCTION sendonce_suppression_of(p_id uuid)
RETURNS TABLE (seq bigint, source text, provider text, reason text, added_by text, added_at timestamptz)
LANGUAGE sql SECURITY DEFINER STABLE AS $$
    SELECT s.seq, s.source, s.provider, s.reason, s.added_by, s.added_at
    FROM sms_outbox o JOIN sms_suppressions s ON s.number OPERATOR(pg_catalog.=) o.to_e164
    WHERE o.id = p_id
$$;

CREATE OR REPLACE FUNCTION sms_outbox_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    move text;
    doubt boolean := OLD.maybe_accepted OR OLD.lookup_pending OR OLD.lookup_everywhere OR OLD.status = 'sending';
    due boolean := NEW.expires_at IS NOT NULL AND NEW.expires_at <= pg_catalog.clock_timestamp();
    listed boolean;
BEGIN
    -- The claim, once a message, first: a row not yet due, or past its
    -- expiry, or to a number on the suppression list (one probe of the
    -- list's key; the statement sees what committed before it began,
    -- later than the claim's own read of the list), with no mark of doubt,
    -- is skipped for every role but the owner: the row is left as it is,
    -- as if another claim held it, and the rest of the statement goes on.
    -- The senders' claim ends such rows itself; the next claim ends a row
    -- suppressed meanwhile.
    IF NEW.status = 'sending' AND OLD.status IN ('pending', 'queued') THEN
        listed := EXISTS (SELECT 1 FROM sms_suppressions s WHERE s.number OPERATOR(pg_catalog.=) NEW.to_e164);
        IF ((NEW.send_at IS NOT NULL AND NEW.send_at > pg_catalog.clock_timestamp()) OR ((due OR listed) AND NOT doubt))
           AND NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
            RETURN NULL;
        END IF;
        IF pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
            RETURN NEW;
        END IF;
    END IF;
    -- The table's CHECK would refuse it too, with the whole row in its
    -- detail.
    IF NEW.status = 'dead' AND NEW.maybe_accepted THEN
        RAISE EXCEPTION 'sms_outbox: a row an attempt may have reached (maybe_accepted) is never dead: end it unknown (sms_outbox_dead_never_maybe_accepted)'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'sms_outbox_dead_never_maybe_accepted',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    IF NEW.status IN ('expired', 'cancelled', 'suppressed') AND NEW.maybe_accepted THEN
        RAISE EXCEPTION 'sms_outbox: a row an attempt may have reached (maybe_accepted) is never %: evidence settles it', NEW.status
            USING ERRCODE = 'check_violation', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    IF NEW.status IN ('delivered', 'undelivered', 'dead', 'expired', 'cancelled', 'suppressed') THEN
        NEW.finished_at := pg_catalog.clock_timestamp();
    ELSIF NEW.status <> 'sent' THEN
        NEW.finished_at := NULL;
    END IF;
    IF NEW.status = 'pending' THEN
        NEW.attempt_count := 0;
    END IF;
    -- Any other move into sending (none a component makes): the same rule.
    IF NEW.status = 'sending' THEN
        listed := coalesce(listed, EXISTS (SELECT 1 FROM sms_suppressions s WHERE s.number OPERATOR(pg_catalog.=) NEW.to_e164));
        IF ((NEW.send_at IS NOT NULL AND NEW.send_at > pg_catalog.clock_timestamp()) OR ((due OR listed) AND NOT doubt))
           AND NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
            RETURN NULL;
        END IF;
    END IF;
    -- Only a row whose number is on the list is suppressed (the owner's
    -- functions decide their own).
    IF NEW.status = 'suppressed'
       AND NOT EXISTS (SELECT 1 FROM sms_suppressions s WHERE s.number OPERATOR(pg_catalog.=) NEW.to_e164)
       AND NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'sms_outbox: only a row whose number is on the suppression list is suppressed'
            USING ERRCODE = 'check_violation', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    move := OLD.status || ' -> ' || NEW.status;
    IF (move IN ('pending -> sending', 'queued -> sending',
                 'sending -> queued', 'sending -> dead', 'sending -> unknown',
                 'unknown -> dead', 'dead -> unknown',
                 'pending -> sent', 'queued -> sent', 'sending -> sent', 'unknown -> sent', 'dead -> sent',
                 'pending -> delivered', 'queued -> delivered', 'sending -> delivered', 'unknown -> delivered', 'sent -> delivered',
                 'pending -> undelivered', 'queued -> undelivered', 'sending -> undelivered', 'unknown -> undelivered', 'sent -> undelivered',
                 'sending -> suppressed')
        OR (move IN ('pending -> expired', 'queued -> expired') AND due AND NOT doubt)
        OR (move = 'sending -> expired' AND due)
        OR (move IN ('pending -> suppressed', 'queued -> suppressed') AND NOT doubt)
        OR move IN ('expired -> sent', 'expired -> delivered', 'expired -> undelivered',
                    'cancelled -> sent', 'cancelled -> delivered', 'cancelled -> undelivered',
                    'suppressed -> sent', 'suppressed -> delivered', 'suppressed -> undelivered'))
       AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF (move IN ('pending -> queued',
                 'unknown -> sent', 'unknown -> delivered', 'unknown -> undelivered', 'unknown -> dead',
                 'dead -> pending', 'unknown -> pending')
        OR (move IN ('queued -> dead', 'queued -> unknown', 'sending -> dead', 'sending -> unknown')
            AND NEW.attempt_count >= NEW.max_attempts)
        OR (move = 'scheduled -> pending' AND NEW.send_at <= pg_catalog.clock_timestamp())
        OR (move IN ('scheduled -> expired', 'pending -> expired', 'queued -> expired') AND due AND NOT doubt
            AND OLD.attempt_count = 0))
       AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'sms_outbox: % may not move a row from % to %', current_user, OLD.status, NEW.status
        USING ERRCODE = 'check_violation',
              DETAIL = 'Statuses move forward only, and each move only by the component that makes it (migration 0018); the relay ends only a row whose attempts are spent (migration 0026), and expires only one no attempt was counted for (migration 0031); a row expires only at its expiry, and is suppressed only while its number is on the suppression list, with no attempt that may have been taken (migrations 0031, 0032).';
END;
$$;

DO $$
DECLARE
    owner name := (SELECT c.relowner::regrole::name FROM pg_catalog.pg_class c WHERE c.oid = 'sms_outbox'::regclass);
    f text;
BEGIN
    EXECUTE pg_catalog.format('ALTER TABLE sms_suppressions OWNER TO %I', owner);
    EXECUTE pg_catalog.format('ALTER TABLE sms_suppression_removals OWNER TO %I', owner);
    EXECUTE pg_catalog.format('ALTER VIEW sms_suppressions_masked OWNER TO %I', owner);
    FOREACH f IN ARRAY ARRAY['sendonce_suppress(text, text)', 'sendonce_suppress_rows(uuid[], text, text[], text[])',
                             'sendonce_suppress_inbound(text, text, text, boolean)', 'sendonce_suppress_add(text[], text, text, text)',
                             'sendonce_suppress_remove(text, text, text, text)',
                             'sendonce_console_suppress(text, text, text, text, text, text)',
                             'sendonce_suppression_check(text)', 'sendonce_suppression_removed(text)',
                             'sendonce_suppression_of(uuid)', 'sendonce_suppression_analyze()'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, pg_catalog.current_schema());
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    -- The helpers run with their caller's rights, on their argument alone.
    FOREACH f IN ARRAY ARRAY['sendonce_mask_number(text)', 'sendonce_suppression_text(text)', 'sendonce_suppression_number(text)'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', f, owner);
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
    EXECUTE pg_catalog.format('ALTER FUNCTION sms_outbox_forward_only() SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
    REVOKE ALL ON FUNCTION sms_outbox_forward_only() FROM PUBLIC;
END $$;

GRANT EXECUTE ON FUNCTION sendonce_suppress(text, text) TO sendonce_app;
GRANT SELECT (number, source, provider) ON sms_suppressions TO sendonce_sender;
GRANT EXECUTE ON FUNCTION sendonce_suppress_rows(uuid[], text, text[], text[]) TO sendonce_sender, sendonce_receiver;
GRANT EXECUTE ON FUNCTION sendonce_suppress_inbound(text, text, text, boolean) TO sendonce_receiver;
GRANT SELECT (seq, source, provider, reason, added_by, added_at) ON sms_suppressions TO sendonce_relay, sendonce_console;
GRANT SELECT ON sms_suppressions_masked TO sendonce_relay, sendonce_console;
GRANT EXECUTE ON FUNCTION sendonce_suppress_add(text[], text, text, text) TO sendonce_relay;
GRANT EXECUTE ON FUNCTION sendonce_suppress_remove(text, text, text, text) TO sendonce_relay;
GRANT EXECUTE ON FUNCTION sendonce_suppression_analyze() TO sendonce_relay;
GRANT EXECUTE ON FUNCTION sendonce_console_suppress(text, text, text, text, text, text) TO sendonce_console;
GRANT EXECUTE ON FUNCTION sendonce_suppression_check(text) TO sendonce_relay, sendonce_console;
GRANT EXECUTE ON FUNCTION sendonce_suppression_removed(text) TO sendonce_relay, sendonce_console;
GRANT EXECUTE ON FUNCTION sendonce_suppression_of(uuid) TO sendonce_relay, sendonce_console;
