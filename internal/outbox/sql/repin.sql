UPDATE sms_outbox SET provider = $4
WHERE id = $1 AND claim_id = $2 AND status = 'sending' AND provider IS NOT DISTINCT FROM nullif($3, '')
