-- The relay reads the age of the oldest open transaction, and no
-- session's SQL.
--
-- Its oldest-transaction gauge read pg_stat_activity with the role
-- pg_read_all_stats (migration 0009), which shows every session of the
-- server, with the text of its statement: another database's
-- CREATE ROLE ... PASSWORD '...', numbers in literal SQL. The relay needs
-- one figure of its own database. sendonce_oldest_transaction() returns
-- it (the start of the oldest open transaction of another client session
-- in this database, NULL for none) and runs with the table owner's rights,
-- so that the relay holds no right on pg_stat_activity's other columns.
--
-- The owner sees every session's transaction start if it is a superuser
-- or holds pg_read_all_stats. Otherwise this migration grants it that
-- role if the migrating user may (the owner's login runs migrations, not
-- a long-lived service), and says so with a notice if not: the gauge then
-- sees the owner's sessions only, until an administrator grants it
-- (docs/operations.md, "Managed Postgres").
--
-- pg_read_all_stats is taken from sendonce_relay where it was granted (a
-- superuser, or a holder of its admin option, may): roles are the
-- server's, so this holds for every database of the server.
CREATE OR REPLACE FUNCTION sendonce_oldest_transaction() RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT pg_catalog.min(a.xact_start) FROM pg_catalog.pg_stat_activity a
    WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
      AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
      AND a.backend_type OPERATOR(pg_catalog.=) 'client backend' AND a.xact_start IS NOT NULL
$$;

DO $$
DECLARE
    owner name := (SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = 'sms_outbox'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sendonce_oldest_transaction() OWNER TO %I', owner);
    EXECUTE format('ALTER FUNCTION sendonce_oldest_transaction() SET search_path = pg_catalog, %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION sendonce_oldest_transaction() FROM PUBLIC;
    IF NOT pg_catalog.pg_has_role(owner, 'pg_read_all_stats', 'USAGE') THEN
        BEGIN
            EXECUTE format('GRANT pg_read_all_stats TO %I', owner);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'not granting pg_read_all_stats to % (%): the oldest-transaction gauge sees only its sessions until an administrator grants it', owner, SQLERRM;
        END;
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION sendonce_oldest_transaction() TO sendonce_relay;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
               WHERE m.roleid = 'pg_read_all_stats'::regrole AND m.member = 'sendonce_relay'::regrole) THEN
        REVOKE pg_read_all_stats FROM sendonce_relay;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'sendonce_relay keeps pg_read_all_stats (%): it reads every session''s SQL on the server; an administrator runs REVOKE pg_read_all_stats FROM sendonce_relay', SQLERRM;
WHEN internal_error THEN
    -- Another database's migration revoked it at the same moment (the
    -- catalog row was gone under this one): done, unless it is still there.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
               WHERE m.roleid = 'pg_read_all_stats'::regrole AND m.member = 'sendonce_relay'::regrole) THEN
        RAISE;
    END IF;
END $$;
