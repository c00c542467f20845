-- The forward-only trigger (migration 0018) decides the moves the pipeline
-- makes for every message in its WHEN, and runs its function only for the
-- others. The function's PL/pgSQL call, with the search_path it sets,
-- cost 2.7 us a move (pg_stat_user_functions, 20,000 pending -> queued),
-- three times a message in a send and four with its receipt: the WHEN is
-- an expression, parsed and bound to its functions and operators now,
-- whatever the search_path of the statement that fires it.
--
-- The WHEN lets through, without the function, exactly what the function's
-- first two tests let through for these moves: the relay's publication
-- (pending -> queued) by a role with sendonce_relay's privileges, and the
-- sender's claim (pending, queued -> sending), retry (sending -> queued)
-- and answer (pending, queued, sending -> sent) by a role with
-- sendonce_sender's. Every other move, and these by any other role (the
-- table's owner included), runs the function as before.
CREATE OR REPLACE TRIGGER sms_outbox_forward_only
    BEFORE UPDATE OF status ON sms_outbox
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NOT (
        (OLD.status = 'pending' AND NEW.status = 'queued'
         AND pg_catalog.pg_has_role(current_user, 'sendonce_relay', 'USAGE'))
        OR (((OLD.status IN ('pending', 'queued') AND NEW.status = 'sending')
             OR (OLD.status = 'sending' AND NEW.status = 'queued')
             OR (OLD.status IN ('pending', 'queued', 'sending') AND NEW.status = 'sent'))
            AND pg_catalog.pg_has_role(current_user, 'sendonce_sender', 'USAGE'))))
    EXECUTE FUNCTION sms_outbox_forward_only();
