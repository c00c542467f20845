-- The planner's estimate of the rows in one status, from the table's
-- statistics. {{status}} is the status, a constant of the package's
-- (never input), written as a literal so that the estimate is for that
-- value: estimateStatements fills it once per status.
EXPLAIN (FORMAT JSON) SELECT 1 FROM sms_outbox WHERE status = '{{status}}'
