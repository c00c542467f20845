CREATE OR REPLACE TRIGGER sms_outbox_forward_only
    BEFORE UPDATE OF status ON sms_outbox
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION sms_outbox_forward_only();
