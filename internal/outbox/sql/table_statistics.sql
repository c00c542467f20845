SELECT relname::text, n_live_tup, n_dead_tup, greatest(last_vacuum, last_autovacuum)
FROM pg_stat_user_tables
WHERE relid IN ('sms_outbox'::regclass, 'sms_attempts'::regclass)
ORDER BY relname
