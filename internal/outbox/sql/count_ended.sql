SELECT count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status = 'unknown'), count(*)
FROM (SELECT status FROM sms_outbox WHERE status IN ('dead', 'unknown') LIMIT $1) AS e
