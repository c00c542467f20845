SELECT id, at, username, role, action, coalesce(detail, ''), refused = 0, coalesce(remote, '')
FROM sendonce_console_audit WHERE action IN ('suppress', 'unsuppress') ORDER BY id DESC LIMIT $1
