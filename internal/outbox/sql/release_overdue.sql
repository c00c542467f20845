UPDATE sms_outbox SET lookups = greatest(lookups - 1, 0), next_attempt_at = now()
WHERE id = ANY($1::uuid[]) AND status = 'sent' AND lookup_pending
