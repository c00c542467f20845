SELECT outbox_id, attempt, started_at, coalesce(latency_ms, 0), outcome,
	coalesce(http_status, 0), coalesce(provider_code, 0), coalesce(error, ''), coalesce(sender, ''), coalesce(provider, ''), false, id
FROM sms_attempts WHERE outbox_id = $1
UNION ALL
-- A row of generation 0 accepted on its first attempt with no record
-- of that attempt (a 429 before it spent no attempt, and is logged):
-- its last event. A replayed or republished row's attempts are all
-- logged.
SELECT o.id, 1, o.sent_at, 0, 'sent', 0, 0, '', '', coalesce(o.provider, ''), true, 9223372036854775807
FROM sms_outbox o
WHERE o.id = $1 AND o.sent_at IS NOT NULL AND o.attempt_count = 1 AND o.publish_gen = 0
  AND NOT EXISTS (SELECT 1 FROM sms_attempts a
	WHERE a.outbox_id = o.id AND a.attempt = 1 AND a.outcome NOT IN ('rate_limited', 'lookup'))
ORDER BY 12
