DROP INDEX IF EXISTS sms_outbox_unlettered_idx;
ALTER TABLE sms_outbox
    DROP COLUMN IF EXISTS claim_id,
    DROP COLUMN IF EXISTS lease_until,
    DROP COLUMN IF EXISTS end_reason,
    DROP COLUMN IF EXISTS letter_seq;
