(SELECT id, status, created_at, next_attempt_at FROM sms_outbox
	WHERE status = 'pending' ORDER BY created_at LIMIT 1)
UNION ALL
(SELECT id, status, updated_at, CASE WHEN status = 'sending' THEN coalesce(lease_until, next_attempt_at) ELSE next_attempt_at END
	FROM sms_outbox WHERE status IN ('queued', 'sending') ORDER BY updated_at LIMIT 1)
