SELECT id, at, username, role, requested, replayed, refused, coalesce(remote, '')
FROM sendonce_console_audit WHERE action = 'replay' ORDER BY id DESC LIMIT $1
