SELECT id, publish_gen, priority, coalesce(traceparent, '') FROM sms_outbox
WHERE status = 'pending' AND (expires_at IS NULL OR expires_at > now())
ORDER BY priority, created_at
LIMIT $1
FOR NO KEY UPDATE SKIP LOCKED
