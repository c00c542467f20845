-- The roles stay: they are cluster-wide and other databases may use them.
REVOKE ALL ON sms_outbox, sms_attempts FROM sendonce_app, sendonce_relay, sendonce_sender;
