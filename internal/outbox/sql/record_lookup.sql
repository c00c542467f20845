INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, detail, source)
VALUES ($1, 'lookup', $2, $3, nullif($4, ''), $5)
