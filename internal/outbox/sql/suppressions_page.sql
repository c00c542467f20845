SELECT seq, number_masked, source, coalesce(provider, ''), reason, added_by, added_at
FROM sms_suppressions_masked WHERE seq > $1 ORDER BY seq LIMIT $2
