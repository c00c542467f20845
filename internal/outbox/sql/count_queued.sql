SELECT count(*) FROM (SELECT 1 FROM sms_outbox WHERE status IN ('queued', 'sending') AND status = 'queued' LIMIT $1) AS s
