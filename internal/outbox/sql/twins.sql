SELECT id, status, coalesce(provider_ref, ''), body FROM sms_outbox
WHERE status IN ('queued', 'sending') AND updated_at >= $3 AND to_e164 = $2 AND id <> $1
  AND (status = 'sending' OR maybe_accepted)
UNION ALL
SELECT id, status, coalesce(provider_ref, ''), body FROM sms_outbox
WHERE status IN ('sent', 'delivered', 'undelivered') AND updated_at >= $3 AND to_e164 = $2 AND id <> $1
UNION ALL
SELECT id, status, coalesce(provider_ref, ''), body FROM sms_outbox
WHERE status = 'unknown' AND updated_at >= $3 AND to_e164 = $2 AND id <> $1
