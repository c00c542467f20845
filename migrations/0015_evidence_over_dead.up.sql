-- A signed receipt for a dead row moves it to what the receipt says (sent,
-- delivered or undelivered): dead promised that the provider never took the
-- message, and the provider says it did. The receiver then clears the row's
-- dead-letter reason and writes a note of what happened in its last error.
-- It writes both without reading them (no SELECT on either), so that a
-- receiver's login still reads nothing of a row but its id, status and
-- provider ids.
GRANT UPDATE (end_reason, last_error) ON sms_outbox TO sendonce_receiver;
