SELECT id FROM sms_outbox
WHERE status = 'scheduled' AND send_at <= statement_timestamp()
ORDER BY send_at
LIMIT $1
FOR NO KEY UPDATE SKIP LOCKED
