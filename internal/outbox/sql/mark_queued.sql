UPDATE sms_outbox o SET status = 'queued', stream_seq = v.seq, updated_at = now()
FROM unnest($1::uuid[], $2::bigint[]) AS v(id, seq)
WHERE o.id = v.id AND o.status = 'pending'
