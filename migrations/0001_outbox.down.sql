DROP TABLE IF EXISTS sms_outbox;
DROP FUNCTION IF EXISTS sms_outbox_notify();
DROP FUNCTION IF EXISTS sms_outbox_immutable_intent();
