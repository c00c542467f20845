SELECT outbox_id, kind, result, source, received_at, count(*) OVER (PARTITION BY outbox_id)
FROM sms_evidence
WHERE outbox_id = ANY($1) AND (kind = 'receipt' OR (kind = 'lookup' AND result IN ('found', 'several')))
ORDER BY outbox_id, id DESC
