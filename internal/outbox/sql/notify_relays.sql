SELECT pg_notify('sms_outbox', '')
