WITH locked AS (
	SELECT id FROM sms_outbox WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE sms_outbox o
SET status = 'sent', provider_ref = coalesce(nullif(v.ref, ''), o.provider_ref), last_error = NULL, end_reason = NULL,
    lookup_pending = false, sent_at = coalesce(o.sent_at, clock_timestamp()), updated_at = clock_timestamp()
FROM unnest($1::uuid[], $2::text[]) AS v(id, ref) JOIN locked USING (id)
WHERE o.id = v.id AND o.status IN ('pending', 'queued', 'sending', 'unknown', 'dead', 'expired', 'cancelled', 'suppressed')
RETURNING o.id, o.publish_gen, o.attempt_count, coalesce(o.end_reason, '')
