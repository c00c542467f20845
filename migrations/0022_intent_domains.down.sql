-- The two checks go back to the table. Adding them reads the whole table.
DROP VIEW sms_outbox_masked;
DROP TRIGGER sms_outbox_immutable_intent ON sms_outbox;

ALTER TABLE sms_outbox
    ALTER COLUMN to_e164 TYPE text,
    ALTER COLUMN body TYPE text;

DROP DOMAIN sendonce_e164;
DROP DOMAIN sendonce_body;

ALTER TABLE sms_outbox
    ADD CONSTRAINT sms_outbox_to_e164_format CHECK (to_e164 ~ '^\+[1-9][0-9]{1,14}$'),
    ADD CONSTRAINT sms_outbox_body_length CHECK (char_length(body) BETWEEN 1 AND 1600);

CREATE TRIGGER sms_outbox_immutable_intent
    BEFORE UPDATE OF id, to_e164, body, priority ON sms_outbox
    FOR EACH ROW EXECUTE FUNCTION sms_outbox_immutable_intent();

CREATE VIEW sms_outbox_masked AS
SELECT id,
       CASE WHEN length(to_e164) < 5 THEN '+***'
            ELSE left(to_e164, 2) || repeat('*', length(to_e164) - 4) || right(to_e164, 2)
       END AS to_masked,
       char_length(body) AS body_chars
FROM sms_outbox;
GRANT SELECT ON sms_outbox_masked TO sendonce_console;
