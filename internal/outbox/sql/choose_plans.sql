SELECT set_config('plan_cache_mode',
CASE WHEN coalesce((SELECT relpages FROM pg_class WHERE oid = to_regclass('sms_outbox')), 0) >= $1
     THEN 'auto' ELSE 'force_custom_plan' END, false)
