WITH locked AS (
	SELECT id FROM sms_outbox WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE sms_outbox o SET attempt_count = v.attempt
FROM unnest($1::uuid[], $2::int[], $3::int[]) AS v(id, attempt, gen) JOIN locked USING (id)
WHERE o.id = v.id AND o.publish_gen = v.gen AND o.attempt_count < v.attempt
