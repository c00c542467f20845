SELECT audit_id, audit_at, changed FROM sendonce_console_suppress($1, $2, $3, $4, $5, $6)
