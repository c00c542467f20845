UPDATE sms_outbox o SET letter_seq = v.seq
FROM unnest($1::uuid[], $2::int[], $3::bigint[]) AS v(id, gen, seq)
WHERE o.id = v.id AND o.publish_gen = v.gen AND o.status IN ('dead', 'unknown') AND o.letter_seq IS NULL
