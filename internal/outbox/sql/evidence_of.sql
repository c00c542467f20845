SELECT kind, result, coalesce(provider_ref, ''), coalesce(code, 0), coalesce(detail, ''),
	coalesce(reported_at, 'epoch'::timestamptz), received_at, source
FROM sms_evidence WHERE outbox_id = $1 ORDER BY id
