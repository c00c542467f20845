-- {{due}} is due_scheduled.sql, which picks and locks the rows to move; the
-- Go code fills it in once, at initialization (promoteDueSQL), and
-- TestTheTimePassReadsOnlyWhatIsDue reads the plan of that part alone.
WITH due AS (
{{due}}
), moved AS (
	UPDATE sms_outbox o
	SET status = CASE WHEN o.expires_at <= clock_timestamp() THEN 'expired' ELSE 'pending' END,
	    last_error = CASE WHEN o.expires_at <= clock_timestamp() THEN 'expired before its send time came round (no call)'
	                      ELSE o.last_error END,
	    next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
	FROM due
	WHERE o.id = due.id AND o.status = 'scheduled'
	RETURNING o.status
)
SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'expired') FROM moved
