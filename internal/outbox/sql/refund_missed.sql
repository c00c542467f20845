WITH locked AS (
	SELECT id FROM sms_outbox WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
-- The claim is cleared with it, so that a write run again (its commit's
-- answer was lost) gives nothing back twice; the row is finished, and
-- nothing else reads the claim of a finished row.
UPDATE sms_outbox o SET attempt_count = greatest(o.attempt_count - 1, 0), claim_id = NULL
FROM unnest($1::uuid[], $2::uuid[]) AS v(id, token) JOIN locked USING (id)
WHERE o.id = v.id AND o.claim_id = v.token
