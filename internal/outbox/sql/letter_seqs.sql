SELECT id, letter_seq FROM sms_outbox
WHERE id = ANY($1) AND status IN ('dead', 'unknown') AND letter_seq > 0
