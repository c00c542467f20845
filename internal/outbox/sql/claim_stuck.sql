SELECT id, status, publish_gen, attempt_count, max_attempts, maybe_accepted, priority, lookup_pending,
       coalesce(traceparent, '')
FROM sms_outbox
WHERE status IN ('queued', 'sending')
  AND ((status = 'sending' AND coalesce(lease_until, updated_at) < now() - $1::interval
                           AND next_attempt_at < now() - $1::interval)
    OR (status = 'queued' AND stream_seq IS NULL AND next_attempt_at <= now())
    OR (status = 'queued' AND updated_at < now() - $1::interval AND next_attempt_at < now() - $1::interval
                          AND (stream_seq <= CASE priority WHEN 1 THEN $2::bigint WHEN 3 THEN $6::bigint ELSE $5::bigint END
                               OR stream_seq > $4)))
ORDER BY updated_at
LIMIT $3
FOR NO KEY UPDATE SKIP LOCKED
