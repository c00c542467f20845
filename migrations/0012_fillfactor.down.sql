ALTER TABLE sms_outbox RESET (fillfactor);
