SELECT o.id, o.status, m.to_masked, m.body_chars, o.attempt_count, o.max_attempts, o.publish_gen,
	o.stream_seq, o.provider_ref, o.last_error, o.created_at, o.updated_at, o.next_attempt_at, o.maybe_accepted,
	o.lease_until, o.end_reason, o.letter_seq, o.priority, o.lookup_pending, o.lookups
FROM sms_outbox o JOIN sms_outbox_masked m ON m.id = o.id WHERE o.id = $1
