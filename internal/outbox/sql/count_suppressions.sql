SELECT source, count(*) FROM (SELECT source FROM sms_suppressions LIMIT $1) s GROUP BY source
