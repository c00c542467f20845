-- Back to a notification at every insert statement, whatever the setting.
CREATE OR REPLACE FUNCTION sms_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sms_outbox', '');
    RETURN NULL;
END;
$$;
