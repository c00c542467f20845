-- The outbox: applications INSERT (id, to_e164, body) in their own transaction;
-- the relay and the senders own every other column.
CREATE TABLE sms_outbox (
    id              uuid        PRIMARY KEY,
    to_e164         text        NOT NULL
                    CONSTRAINT sms_outbox_to_e164_format CHECK (to_e164 ~ '^\+[1-9][0-9]{1,14}$'),
    body            text        NOT NULL
                    CONSTRAINT sms_outbox_body_length CHECK (char_length(body) BETWEEN 1 AND 1600),
    status          text        NOT NULL DEFAULT 'pending'
                    CONSTRAINT sms_outbox_status_valid
                    CHECK (status IN ('pending', 'queued', 'sending', 'sent', 'dead', 'unknown')),
    attempt_count   integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts    integer     NOT NULL DEFAULT 8 CHECK (max_attempts BETWEEN 1 AND 1000),
    -- publish_gen numbers the publications of a row: the Nats-Msg-Id is the id for
    -- generation 0 and "id:N" after, so a deliberate republish is never deduplicated
    -- while the Idempotency-Key (the id) stays the same.
    publish_gen     integer     NOT NULL DEFAULT 0 CHECK (publish_gen >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    provider_ref    text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Serves the relay's claim: only pending rows, oldest first. Small, because rows
-- leave 'pending' within milliseconds.
CREATE INDEX sms_outbox_pending_idx ON sms_outbox (created_at) WHERE status = 'pending';

-- Serves the reconciler and the operators' "stuck rows" queries.
CREATE INDEX sms_outbox_inflight_idx ON sms_outbox (updated_at) WHERE status IN ('queued', 'sending');

-- I4: one key <-> one payload. Changed content must be a new row with a new id.
CREATE FUNCTION sms_outbox_immutable_intent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.to_e164 IS DISTINCT FROM OLD.to_e164
       OR NEW.body IS DISTINCT FROM OLD.body THEN
        RAISE EXCEPTION 'sms_outbox: id, to_e164 and body are immutable (insert a new row instead)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER sms_outbox_immutable_intent
    BEFORE UPDATE OF id, to_e164, body ON sms_outbox
    FOR EACH ROW EXECUTE FUNCTION sms_outbox_immutable_intent();

-- Wakes the relays at commit. Once per statement: a notification is only a hint,
-- and NOTIFY collapses duplicates within a transaction anyway.
CREATE FUNCTION sms_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sms_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER sms_outbox_notify
    AFTER INSERT ON sms_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION sms_outbox_notify();
