-- GetRow's read of one row. get_row_without_content.sql is this statement
-- without the number and the body, for a role that may not read them;
-- both return the same columns after these two.
SELECT id, status, to_e164, char_length(body),
	attempt_count, max_attempts, publish_gen, stream_seq, provider_ref, last_error, created_at, updated_at,
	next_attempt_at, maybe_accepted, lease_until, end_reason, letter_seq, lookup_pending, lookups, coalesce(provider, ''),
	send_at, expires_at
FROM sms_outbox WHERE id = $1
