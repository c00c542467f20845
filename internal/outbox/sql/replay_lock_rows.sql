SELECT id, status, publish_gen, coalesce(end_reason, ''), false FROM sms_outbox
WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE
