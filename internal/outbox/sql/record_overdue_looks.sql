WITH locked AS (
	SELECT id FROM sms_outbox WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE sms_outbox o
SET status = CASE WHEN v.fate <> '' THEN v.fate ELSE o.status END,
    provider_ref = CASE WHEN v.fate <> '' THEN coalesce(o.provider_ref, nullif(v.ref, '')) ELSE o.provider_ref END,
    lookup_pending = false,
    updated_at = CASE WHEN v.fate <> '' THEN clock_timestamp() ELSE o.updated_at END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bool[]) AS v(id, fate, ref, last)
     JOIN locked USING (id)
WHERE o.id = v.id AND o.status = 'sent' AND (v.fate <> '' OR (v.last AND o.lookup_pending))
RETURNING o.id, o.status
