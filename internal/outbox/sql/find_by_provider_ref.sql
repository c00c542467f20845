SELECT id FROM sms_outbox WHERE provider_ref = $1 LIMIT 10
