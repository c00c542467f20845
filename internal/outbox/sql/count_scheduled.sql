SELECT count(*) FROM (SELECT 1 FROM sms_outbox WHERE status = 'scheduled' LIMIT $1) AS s
