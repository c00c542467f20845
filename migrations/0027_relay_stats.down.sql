-- The function goes; the relay's gauge of the release before reads
-- pg_stat_activity itself and sees its own sessions only. pg_read_all_stats
-- is not given back to sendonce_relay: an administrator who wants that
-- grants it.
DROP FUNCTION IF EXISTS sendonce_oldest_transaction();
