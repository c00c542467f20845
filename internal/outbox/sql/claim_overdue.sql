WITH due AS (
	SELECT id FROM sms_outbox
	WHERE status = 'sent' AND lookup_pending AND next_attempt_at <= now()
	ORDER BY next_attempt_at
	LIMIT $1
	FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE sms_outbox o
SET lookups = least(o.lookups + 1, 32767),
    next_attempt_at = clock_timestamp() + greatest($3::float8,
        coalesce(($2::float8[])[o.lookups + 1], ($2::float8[])[cardinality($2::float8[])])) * interval '1 second'
FROM due WHERE o.id = due.id
RETURNING o.id, o.to_e164, o.body, coalesce(o.provider_ref, ''), o.created_at, o.updated_at, o.lookups, coalesce(o.provider, '')
