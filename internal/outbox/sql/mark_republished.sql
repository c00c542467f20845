UPDATE sms_outbox
SET publish_gen = $2, stream_seq = $3, next_attempt_at = now(),
    updated_at = CASE WHEN status = 'queued' THEN now() ELSE updated_at END
WHERE id = $1 AND status IN ('queued', 'sending')
