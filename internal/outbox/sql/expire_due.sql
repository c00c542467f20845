-- {{due}} is due_expiring.sql, which picks and locks the rows to move; the
-- Go code fills it in once, at initialization (expireDueSQL), and
-- TestTheTimePassReadsOnlyWhatIsDue reads the plan of that part alone.
WITH due AS (
{{due}}
)
UPDATE sms_outbox o
SET status = 'expired', claim_id = NULL, lease_until = NULL,
    last_error = 'expired before any provider call', updated_at = clock_timestamp()
FROM due
WHERE o.id = due.id AND o.status IN ('scheduled', 'pending', 'queued')
  AND NOT o.maybe_accepted AND NOT o.lookup_pending AND NOT o.lookup_everywhere AND o.attempt_count = 0
