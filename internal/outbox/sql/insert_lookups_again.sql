-- insert_lookups.sql for a batch that may have been committed before:
-- a record already there (same row, same time) is not added twice.
INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, detail, received_at, source)
SELECT v.id, 'lookup', v.result, v.ref, nullif(v.detail, ''), v.at, v.source
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::text[])
	AS v(id, result, ref, detail, at, source)
JOIN sms_outbox o ON o.id = v.id
LEFT JOIN LATERAL (SELECT true AS dup FROM sms_evidence e
	WHERE e.outbox_id = v.id AND e.kind = 'lookup' AND e.received_at = v.at
	LIMIT 1) seen ON true
WHERE seen.dup IS NULL
