SELECT audit_id, audit_at, replayed_rows FROM sendonce_console_replay($1, $2, $3, $4, $5)
