SELECT count(*), extract(epoch FROM now() - min(updated_at))
FROM (SELECT updated_at FROM sms_outbox WHERE status = 'sent' AND lookup_pending LIMIT $1) AS s
