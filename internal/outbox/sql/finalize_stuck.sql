UPDATE sms_outbox SET status = $2, end_reason = $3, last_error = $4, updated_at = now()
WHERE id = $1 AND status IN ('queued', 'sending')
