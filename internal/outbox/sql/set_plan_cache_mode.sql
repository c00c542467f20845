SELECT set_config('plan_cache_mode', $1, false)
