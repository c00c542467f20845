SELECT extract(epoch FROM now() - min(greatest(oldest.created_at, oldest.send_at)))
FROM generate_series(1, 3) AS lane(priority)
CROSS JOIN LATERAL (SELECT created_at, send_at FROM sms_outbox
	WHERE status = 'pending' AND priority = lane.priority
	ORDER BY created_at LIMIT 100) AS oldest
