SELECT m, sum(sent)::bigint, sum(retry)::bigint, sum(failed)::bigint FROM (
	SELECT date_bin('1 minute', started_at, $1) AS m, 0 AS sent,
		count(*) FILTER (WHERE outcome IN ('retry', 'rate_limited')) AS retry,
		count(*) FILTER (WHERE outcome NOT IN ('sent', 'retry', 'rate_limited')) AS failed
	FROM sms_attempts WHERE started_at >= $1 GROUP BY 1
	UNION ALL
	SELECT date_bin('1 minute', sent_at, $1), count(*), 0, 0
	FROM sms_outbox
	WHERE status IN ('sent', 'delivered', 'undelivered') AND updated_at >= $1 AND sent_at >= $1 GROUP BY 1
) per GROUP BY m ORDER BY m
