SELECT coalesce(end_reason, ''), count(*) FROM sms_outbox
WHERE status IN ('dead', 'unknown') AND updated_at >= $1 GROUP BY 1
