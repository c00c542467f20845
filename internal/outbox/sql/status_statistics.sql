SELECT
greatest(coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'sms_outbox'::regclass), 0),
         (SELECT reltuples FROM pg_class WHERE oid = 'sms_outbox'::regclass)::bigint),
(SELECT most_common_vals::text::text[] FROM pg_stats
  WHERE schemaname = current_schema() AND tablename = 'sms_outbox' AND attname = 'status'),
(SELECT most_common_freqs FROM pg_stats
  WHERE schemaname = current_schema() AND tablename = 'sms_outbox' AND attname = 'status')
