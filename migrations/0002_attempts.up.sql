-- stream_seq: the JetStream sequence of the row's current publication, set
-- with the queued status. The reconciler compares it with the consumer's
-- delivered sequence to tell "still in the backlog" from "lost".
ALTER TABLE sms_outbox ADD COLUMN stream_seq bigint;

-- One row per provider attempt, and per decision that finished a message
-- without a call. Never the phone number or the body.
CREATE TABLE sms_attempts (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id     uuid        NOT NULL REFERENCES sms_outbox (id) ON DELETE CASCADE,
    attempt       integer     NOT NULL,
    started_at    timestamptz NOT NULL,
    latency_ms    double precision,
    outcome       text        NOT NULL
                  CHECK (outcome IN ('sent', 'retry', 'permanent', 'ambiguous', 'max_attempts')),
    http_status   integer,
    provider_code integer,
    error         text,
    sender        text
);

CREATE INDEX sms_attempts_outbox_idx ON sms_attempts (outbox_id, id);
