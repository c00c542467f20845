-- {{where}} is the rows' conditions, o.status IN ('dead', 'unknown') and
-- those the console's filter sets, and {{limit}} the parameter of the
-- limit, whose number follows theirs: DeadFilter.statement fills both at
-- each call. a is each row's last attempt.
SELECT code, reason, count(*) FROM (
	SELECT coalesce(a.provider_code, 0) AS code, coalesce(o.end_reason, '') AS reason
	FROM sms_outbox o LEFT JOIN LATERAL (SELECT provider_code, http_status FROM sms_attempts
		WHERE outbox_id = o.id ORDER BY id DESC LIMIT 1) a ON true
	WHERE {{where}} ORDER BY o.updated_at DESC LIMIT {{limit}}) m
GROUP BY code, reason
