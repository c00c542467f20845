-- insert_attempts_again.sql is this statement for a batch that may
-- have been committed before.
INSERT INTO sms_attempts
	(outbox_id, attempt, started_at, latency_ms, outcome, http_status, provider_code, error, sender, provider)
SELECT v.* FROM unnest($1::uuid[], $2::int[], $3::timestamptz[], $4::float8[], $5::text[],
                       $6::int[], $7::int[], $8::text[], $9::text[], $10::text[]) AS v(outbox_id, attempt, started_at)
-- A row that is gone keeps no record: its insert was lost with a
-- failed-over primary, while a sender held its outcome.
JOIN sms_outbox o ON o.id = v.outbox_id
