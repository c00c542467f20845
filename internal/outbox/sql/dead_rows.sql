-- {{where}} is the rows' conditions, o.status IN ('dead', 'unknown') and
-- those the console's filter sets, and {{limit}} the parameter of the
-- limit, whose number follows theirs: DeadFilter.statement fills both at
-- each call. a is each row's last attempt.
SELECT o.id, o.status, coalesce(o.end_reason, ''), o.publish_gen, o.attempt_count, o.letter_seq,
	coalesce(o.last_error, ''), coalesce(a.provider_code, 0), coalesce(a.http_status, 0), o.updated_at
FROM sms_outbox o LEFT JOIN LATERAL (SELECT provider_code, http_status FROM sms_attempts
	WHERE outbox_id = o.id ORDER BY id DESC LIMIT 1) a ON true
WHERE {{where}} ORDER BY o.updated_at DESC LIMIT {{limit}}
