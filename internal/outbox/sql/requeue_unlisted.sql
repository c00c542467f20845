WITH locked AS (
	SELECT id FROM sms_outbox WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE sms_outbox o
SET status = 'queued', next_attempt_at = clock_timestamp(), stream_seq = NULL,
    attempt_count = greatest(o.attempt_count - 1, 0), updated_at = clock_timestamp(),
    last_error = 'its number left the suppression list before the row was ended: it waits to be sent'
FROM unnest($1::uuid[], $2::uuid[]) AS v(id, token) JOIN locked USING (id)
WHERE o.id = v.id AND o.claim_id = v.token AND o.status = 'sending'
RETURNING o.id, o.publish_gen, o.attempt_count, coalesce(o.end_reason, '')
