WITH v AS (
	SELECT * FROM unnest($1::uuid[], $2::bool[], $3::float8[], $4::text[], $5::bool[], $6::bool[]) AS v(id, lookup, delay, prov, everywhere, mark)
), locked AS (
	SELECT id FROM sms_outbox WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE sms_outbox o
SET maybe_accepted = o.maybe_accepted OR v.mark,
    lookup_pending = o.lookup_pending OR v.lookup,
    next_attempt_at = CASE WHEN v.mark AND o.status IN ('pending', 'queued')
                           THEN greatest(o.next_attempt_at, clock_timestamp() + v.delay * interval '1 second')
                           ELSE o.next_attempt_at END,
    provider = coalesce(nullif(v.prov, ''), o.provider),
    lookup_everywhere = coalesce(v.everywhere, o.lookup_everywhere),
    updated_at = clock_timestamp()
FROM v JOIN locked USING (id)
WHERE o.id = v.id AND o.status IN ('pending', 'queued', 'sending')
