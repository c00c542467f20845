WITH chunk AS MATERIALIZED (
	SELECT updated_at, status FROM sms_outbox
	WHERE status IN ('sent', 'delivered', 'undelivered', 'dead')
	  AND updated_at >= greatest($1::timestamptz, now() - $2::interval - $4::interval)
	  AND updated_at <= now() - $2::interval
	ORDER BY updated_at
	LIMIT $3
), found AS (
	SELECT o.id FROM (SELECT DISTINCT updated_at FROM chunk WHERE status = 'sent') c
	JOIN sms_outbox o ON o.updated_at = c.updated_at
	WHERE o.status IN ('sent', 'delivered', 'undelivered', 'dead') AND o.status = 'sent' AND NOT o.lookup_pending
	  AND ($5 OR o.provider_ref IS NOT NULL)
	ORDER BY o.id
	FOR NO KEY UPDATE OF o SKIP LOCKED
), marked AS (
	UPDATE sms_outbox o SET lookup_pending = true, lookups = 0, next_attempt_at = clock_timestamp()
	FROM found WHERE o.id = found.id
	RETURNING o.id
)
SELECT (SELECT count(*) FROM chunk), (SELECT max(updated_at) FROM chunk), now() - $2::interval,
       (SELECT count(*) FROM marked)
