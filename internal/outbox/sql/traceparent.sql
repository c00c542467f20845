SELECT traceparent FROM sms_outbox WHERE id = $1
