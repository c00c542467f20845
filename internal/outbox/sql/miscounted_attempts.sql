WITH r AS (
	SELECT id, attempt_count, publish_gen, sent_at FROM sms_outbox
	WHERE $1::uuid[] IS NULL OR id = ANY($1::uuid[])
), log AS (
	SELECT a.outbox_id, a.attempt, a.outcome NOT IN ('rate_limited', 'lookup') AS spends, a.started_at, a.id,
	       CASE WHEN a.attempt < lag(a.attempt) OVER w THEN 1 ELSE 0 END AS restart
	FROM sms_attempts a JOIN r ON r.id = a.outbox_id
	WINDOW w AS (PARTITION BY a.outbox_id ORDER BY a.started_at, a.id)
), replays AS (
	SELECT *, sum(restart) OVER (PARTITION BY outbox_id ORDER BY started_at, id) AS replay FROM log
), numbers AS (
	SELECT outbox_id, attempt, bool_or(spends) AS spent
	FROM (SELECT *, max(replay) OVER (PARTITION BY outbox_id) AS latest FROM replays) x
	WHERE replay = latest
	GROUP BY outbox_id, attempt
)
SELECT count(*) FROM r
WHERE EXISTS (SELECT 1 FROM numbers n WHERE n.outbox_id = r.id
	AND ((n.attempt <= r.attempt_count AND NOT n.spent
	      AND NOT (n.attempt = 1 AND r.attempt_count = 1 AND r.publish_gen = 0 AND r.sent_at IS NOT NULL))
	  OR (n.spent AND n.attempt > r.attempt_count)))
