-- The number and the body are checked once, when a row is written, and no
-- more at every move of its status.
--
-- Postgres evaluates every CHECK constraint of a table at every UPDATE of a
-- row, whichever columns the UPDATE sets. A message's row is updated three
-- times in a send (queued, sending, sent) and four with its receipt, and
-- each time the number's regular expression and the body's length were
-- checked again, though neither can change (sms_outbox_immutable_intent).
-- psql, 50,000 rows moved through four statuses: 1.85 us an update less
-- without these two checks, about a sixth of each update's cost.
--
-- A domain's CHECK runs where a value is converted to the domain: an INSERT,
-- a COPY or an UPDATE that sets the column, never an UPDATE that leaves it
-- as it is. The two checks become the domains' own, with the same names,
-- so a bad row is refused as before: check_violation (23514) naming
-- sms_outbox_to_e164_format or sms_outbox_body_length. Clients see text:
-- Postgres describes a domain's column by its base type.
--
-- Changing a column to a domain with no constraint rewrites nothing, and
-- the checks come back NOT VALID: every row already passed them as the
-- table's constraints, and validating would read the whole table under a
-- lock that stops the applications' inserts. The view and the trigger over
-- the two columns are made again around the change (a column they read
-- cannot change type).
CREATE DOMAIN sendonce_e164 AS text;
CREATE DOMAIN sendonce_body AS text;

DROP VIEW sms_outbox_masked;
DROP TRIGGER sms_outbox_immutable_intent ON sms_outbox;

ALTER TABLE sms_outbox
    DROP CONSTRAINT sms_outbox_to_e164_format,
    DROP CONSTRAINT sms_outbox_body_length,
    ALTER COLUMN to_e164 TYPE sendonce_e164,
    ALTER COLUMN body TYPE sendonce_body;

ALTER DOMAIN sendonce_e164 ADD CONSTRAINT sms_outbox_to_e164_format
    CHECK (VALUE ~ '^\+[1-9][0-9]{1,14}$') NOT VALID;
ALTER DOMAIN sendonce_body ADD CONSTRAINT sms_outbox_body_length
    CHECK (char_length(VALUE) BETWEEN 1 AND 1600) NOT VALID;

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
