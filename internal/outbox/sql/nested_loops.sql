SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)
