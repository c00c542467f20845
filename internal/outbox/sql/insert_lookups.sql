-- A row lost with a failed-over primary keeps nothing: the join with
-- sms_outbox leaves its lookup out. insert_lookups_again.sql is this
-- statement for a batch that may have been committed before.
INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, detail, received_at, source)
SELECT v.id, 'lookup', v.result, v.ref, nullif(v.detail, ''), v.at, v.source
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::text[])
	AS v(id, result, ref, detail, at, source)
JOIN sms_outbox o ON o.id = v.id
