UPDATE sms_outbox
SET status = 'pending', publish_gen = publish_gen + 1,
    next_attempt_at = now(), updated_at = now(), stream_seq = NULL,
    claim_id = NULL, lease_until = NULL, end_reason = NULL, letter_seq = NULL,
    last_error = 'replayed by operator; before: ' || coalesce(last_error, '')
WHERE id = $1 AND status IN ('dead', 'unknown')
