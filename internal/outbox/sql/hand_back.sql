WITH d AS (
	SELECT DISTINCT ON (id) id, seq, delivery FROM unnest($1::uuid[], $2::bigint[], $3::int[]) AS d(id, seq, delivery)
	WHERE seq > 0 AND delivery > 0
	ORDER BY id, delivery DESC
), cur AS (
	SELECT o.id FROM sms_outbox o JOIN d USING (id)
	WHERE o.status IN ('pending', 'queued', 'sending')
	  AND (d.delivery = 1
	       OR (o.claim_seq = d.seq AND o.claim_delivery = d.delivery - 1)
	       OR (o.handback_seq = d.seq AND o.handback_delivery = d.delivery - 1))
	ORDER BY o.id
	FOR NO KEY UPDATE OF o
)
UPDATE sms_outbox o SET handback_seq = d.seq, handback_delivery = d.delivery
FROM cur JOIN d USING (id)
WHERE o.id = cur.id
