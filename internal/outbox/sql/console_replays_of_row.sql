-- console_replays.sql for the replays that replayed one row, $2.
SELECT id, at, username, role, requested, replayed, refused, coalesce(remote, '')
FROM sendonce_console_audit WHERE action = 'replay' AND replayed @> ARRAY[$2::uuid] ORDER BY id DESC LIMIT $1
