SELECT
(SELECT count(*) FROM (SELECT 1 FROM sms_outbox WHERE status = 'pending' AND created_at >= $1 LIMIT $2) g),
(SELECT count(*) FILTER (WHERE status = 'queued') FROM
	(SELECT status FROM sms_outbox WHERE status IN ('queued', 'sending') AND updated_at >= $1 LIMIT $2) g),
(SELECT count(*) FILTER (WHERE status = 'sending') FROM
	(SELECT status FROM sms_outbox WHERE status IN ('queued', 'sending') AND updated_at >= $1 LIMIT $2) g),
f.sent, f.delivered, f.undelivered, f.final,
(SELECT count(*) FILTER (WHERE status = 'dead') FROM
	(SELECT status FROM sms_outbox WHERE status IN ('dead', 'unknown') AND updated_at >= $1 LIMIT $2) g),
(SELECT count(*) FILTER (WHERE status = 'unknown') FROM
	(SELECT status FROM sms_outbox WHERE status IN ('dead', 'unknown') AND updated_at >= $1 LIMIT $2) g),
u.expired, u.cancelled, u.suppressed, u.unsent
FROM (SELECT count(*) FILTER (WHERE status = 'sent') AS sent,
		count(*) FILTER (WHERE status = 'delivered') AS delivered,
		count(*) FILTER (WHERE status = 'undelivered') AS undelivered,
		count(*) AS final
	FROM (SELECT status FROM sms_outbox
		WHERE status IN ('sent', 'delivered', 'undelivered', 'dead') AND updated_at >= $1 LIMIT $2) g) f,
	(SELECT count(*) FILTER (WHERE status = 'expired') AS expired,
		count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
		count(*) FILTER (WHERE status = 'suppressed') AS suppressed,
		count(*) AS unsent
	FROM (SELECT status FROM sms_outbox
		WHERE status IN ('expired', 'cancelled', 'suppressed') AND updated_at >= $1 LIMIT $2) g) u
