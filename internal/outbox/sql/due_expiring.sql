SELECT id FROM sms_outbox
WHERE expires_at IS NOT NULL AND status IN ('scheduled', 'pending', 'queued') AND expires_at <= statement_timestamp()
  AND NOT maybe_accepted AND NOT lookup_pending AND NOT lookup_everywhere AND attempt_count = 0
ORDER BY expires_at
LIMIT $1
FOR NO KEY UPDATE SKIP LOCKED
