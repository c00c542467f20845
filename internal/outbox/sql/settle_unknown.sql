UPDATE sms_outbox
SET status = $3,
    provider_ref = coalesce(nullif($4, ''), provider_ref),
    maybe_accepted = CASE WHEN $3 = 'dead' THEN false ELSE maybe_accepted END,
    last_error = CASE WHEN $3 = 'dead' THEN $5 END,
    lookup_pending = false,
    sent_at = CASE WHEN $3 = 'dead' THEN sent_at ELSE coalesce(sent_at, clock_timestamp()) END,
    updated_at = clock_timestamp()
WHERE id = $1 AND publish_gen = $2 AND status = 'unknown'
