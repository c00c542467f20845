-- Least-privilege roles. They are NOLOGIN groups: a deployment creates login
-- roles IN ROLE one of them (CREATE ROLE relay1 LOGIN IN ROLE sendonce_relay,
-- its password set with psql's \password or a SCRAM verifier, never in the
-- SQL: docs/security.md). Roles are cluster-wide, so creating them tolerates another
-- database (or a concurrent migration) having done it first. A role that
-- exists is not created again: on managed Postgres the owner that migrates
-- may not create roles, and an administrator creates them once beforehand
-- (docs/operations.md, managed Postgres).
DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['sendonce_app', 'sendonce_relay', 'sendonce_sender'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role % is missing and % may not create it: an administrator creates the roles once (CREATE ROLE sendonce_app NOLOGIN; and sendonce_relay, sendonce_sender, sendonce_receiver, sendonce_console: docs/operations.md, managed Postgres)', r, current_user
                USING ERRCODE = 'insufficient_privilege';
        END;
    END LOOP;
END $$;

-- Applications: write the intent, read back its status. Never the other
-- rows' numbers or bodies.
GRANT INSERT (id, to_e164, body) ON sms_outbox TO sendonce_app;
GRANT SELECT (id, status, attempt_count, provider_ref, last_error, created_at, updated_at) ON sms_outbox TO sendonce_app;

-- The relay: claim pending rows (FOR UPDATE needs an UPDATE grant), mark them
-- queued, reconcile, purge; never the number or the body.
GRANT SELECT (id, status, attempt_count, max_attempts, publish_gen, stream_seq, next_attempt_at,
              last_error, provider_ref, created_at, updated_at) ON sms_outbox TO sendonce_relay;
GRANT UPDATE (status, publish_gen, stream_seq, next_attempt_at, last_error, attempt_count, updated_at)
    ON sms_outbox TO sendonce_relay;
GRANT DELETE ON sms_outbox TO sendonce_relay;
GRANT SELECT, INSERT, DELETE ON sms_attempts TO sendonce_relay;

-- The senders: claim rows and read the message, write outcomes and attempts.
GRANT SELECT (id, to_e164, body, status, attempt_count, max_attempts, publish_gen, next_attempt_at,
              created_at, updated_at) ON sms_outbox TO sendonce_sender;
GRANT UPDATE (status, attempt_count, provider_ref, last_error, next_attempt_at, updated_at)
    ON sms_outbox TO sendonce_sender;
GRANT INSERT ON sms_attempts TO sendonce_sender;
