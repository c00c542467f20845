-- The unknown rows relay resolve looks up. {{columns}} is the number and
-- the body (o.to_e164, o.body) for a lookup that needs them, or empty
-- strings in their place ('' AS to_e164, '' AS body) for a role that may
-- not read them: unknownRowsSQL and unknownRowsWithContentSQL, filled
-- once at initialization.
SELECT id, publish_gen, to_e164, body, created_at, first_attempt,
	updated_at <= now() - $3::interval, first_attempt <= now() - $4::interval, provider
FROM (SELECT o.id, o.publish_gen, {{columns}}, o.created_at, o.updated_at, coalesce(o.provider, '') AS provider,
	coalesce((SELECT CASE WHEN a.attempt = 1 THEN a.started_at END FROM sms_attempts a
		-- The calls, not a 429 (taken by nobody) or a lookup; nor
		-- the reconciler's record of a dead attempt, made later.
		WHERE a.outbox_id = o.id AND a.outcome NOT IN ('rate_limited', 'lookup')
		  AND a.sender IS DISTINCT FROM 'reconciler'
		ORDER BY a.started_at, a.id LIMIT 1), o.created_at) AS first_attempt
	FROM sms_outbox o
	WHERE o.status = 'unknown' AND ($1::uuid IS NULL OR o.id = $1)
	ORDER BY o.updated_at
	LIMIT $2) u
ORDER BY updated_at
