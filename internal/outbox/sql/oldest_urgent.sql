SELECT extract(epoch FROM now() - min(greatest(u.created_at, u.send_at))) FROM
(SELECT created_at, send_at FROM sms_outbox WHERE priority = 1 AND status IN ('pending', 'queued', 'sending')
 ORDER BY created_at LIMIT 100) u
