-- The receiver no longer moves dead rows (a release before 0015 records
-- their receipts and leaves them dead).
REVOKE UPDATE (end_reason, last_error) ON sms_outbox FROM sendonce_receiver;
