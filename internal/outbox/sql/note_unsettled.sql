UPDATE sms_outbox SET last_error = $3, updated_at = clock_timestamp()
WHERE id = $1 AND publish_gen = $2 AND status = 'unknown'
