SELECT o.id, o.publish_gen, o.status, coalesce(o.end_reason, ''), coalesce(o.last_error, ''),
	o.attempt_count,
	coalesce((SELECT a.provider_code FROM sms_attempts a WHERE a.outbox_id = o.id ORDER BY a.id DESC LIMIT 1), 0)
FROM sms_outbox o
WHERE o.status IN ('dead', 'unknown') AND o.letter_seq IS NULL AND o.updated_at < now() - $1::interval
ORDER BY o.updated_at
LIMIT $2
FOR NO KEY UPDATE OF o SKIP LOCKED
