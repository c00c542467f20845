SELECT status, count(*) FROM sms_outbox GROUP BY status
