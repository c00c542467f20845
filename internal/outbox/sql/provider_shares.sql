SELECT provider, sum(sent)::bigint, sum(failed)::bigint, sum(moved)::bigint FROM (
	SELECT provider, count(*) AS sent, 0 AS failed, 0 AS moved
	FROM sms_outbox
	WHERE status IN ('sent', 'delivered', 'undelivered') AND updated_at >= $1 AND sent_at >= $1 AND provider IS NOT NULL
	GROUP BY 1
	UNION ALL
	SELECT provider, 0, count(*) FILTER (WHERE outcome NOT IN ('sent', 'lookup')),
		count(*) FILTER (WHERE outcome = 'retry' AND error LIKE 'not taken, moved to %')
	FROM sms_attempts WHERE started_at >= $1 AND provider IS NOT NULL
	GROUP BY 1
) per GROUP BY provider ORDER BY provider
