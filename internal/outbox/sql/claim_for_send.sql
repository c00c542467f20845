WITH cur AS (
	SELECT o.id, o.status, o.claim_id,
	       coalesce(o.lease_until, o.updated_at + $2::interval) AS lease_until, o.next_attempt_at,
	       o.claim_seq, o.claim_delivery, o.handback_seq, o.handback_delivery,
	       -- Past its expiry with no attempt that may have been taken: the
	       -- claim ends it expired rather than sending (I10), unless its
	       -- delivery says a claim may be lost (below).
	       o.status IN ('pending', 'queued') AND coalesce(o.expires_at <= clock_timestamp(), false)
	           AND NOT o.maybe_accepted AND NOT o.lookup_pending AND NOT o.lookup_everywhere AS expires_due,
	       -- The number's entry on the suppression list (one probe of its
	       -- key), if any: an unmarked row ends suppressed rather than
	       -- sending (I10); a marked one is claimed, to be settled by
	       -- evidence and never called.
	       s.source AS sup_source, s.provider AS sup_provider,
	       o.status IN ('pending', 'queued') AND s.source IS NOT NULL
	           AND NOT o.maybe_accepted AND NOT o.lookup_pending AND NOT o.lookup_everywhere AS listed
	FROM sms_outbox o
	LEFT JOIN sms_suppressions s ON s.number OPERATOR(pg_catalog.=) o.to_e164
	WHERE o.id = ANY($1::uuid[])
	ORDER BY o.id
	FOR NO KEY UPDATE OF o
), upd AS (
	UPDATE sms_outbox o
	SET status = CASE WHEN expiring THEN 'expired' WHEN suppressing THEN 'suppressed' ELSE 'sending' END,
	    attempt_count = CASE WHEN mine OR expiring OR suppressing THEN o.attempt_count ELSE o.attempt_count + 1 END,
	    claim_id = CASE WHEN expiring OR suppressing THEN NULL ELSE $3 END,
	    lease_until = CASE WHEN expiring OR suppressing THEN NULL ELSE clock_timestamp() + $2::interval END,
	    last_error = CASE WHEN expiring THEN 'expired before any provider call'
	                      WHEN suppressing THEN 'suppressed before any provider call: the number is on the suppression list (source '
	                                            || sup_source || coalesce(' ' || sup_provider, '') || ')'
	                      ELSE o.last_error END,
	    updated_at = clock_timestamp(),
	    maybe_accepted = o.maybe_accepted OR (cur.status = 'sending' AND NOT mine),
	    claim_seq = CASE WHEN mine THEN o.claim_seq ELSE nullif(cur.seq, 0) END,
	    claim_delivery = CASE WHEN mine THEN o.claim_delivery ELSE nullif(cur.delivery, 0) END,
	    -- A row attempted and naming no provider (a failover lost the
	    -- claim that named it) belongs to the provider its attempts went
	    -- to; one attempted before rows named a provider, to the first.
	    provider = CASE WHEN $7 = '' THEN o.provider
	               WHEN o.provider IS NOT NULL THEN o.provider
	               WHEN o.attempt_count = 0 THEN coalesce(nullif(cur.pref, ''), nullif($6, ''))
	               ELSE coalesce((SELECT a.provider FROM sms_attempts a
	                              WHERE a.outbox_id = o.id AND a.provider IS NOT NULL
	                                AND a.outcome NOT IN ('lookup', 'rate_limited')
	                              ORDER BY a.id DESC LIMIT 1), $7) END
	FROM (SELECT x.*, x.expires_due AND NOT x.unaccounted AS expiring,
	             -- Expiry first: a row past it and listed ends expired.
	             x.listed AND NOT x.unaccounted AND NOT (x.expires_due AND NOT x.unaccounted) AS suppressing
	      FROM (SELECT c.*, c.status = 'sending' AND c.claim_id IS NOT DISTINCT FROM $3 AS mine, d.seq, d.delivery, d.pref,
	                   -- A redelivery whose previous delivery the row does
	                   -- not account for (its claim or its hand-back) may
	                   -- follow a claim a failover lost with its call:
	                   -- neither expiry nor the list overrides that doubt,
	                   -- the sender settles it (never by a call).
	                   d.delivery > 1
	                   AND NOT (c.claim_seq IS NOT DISTINCT FROM d.seq AND c.claim_delivery IN (d.delivery - 1, d.delivery))
	                   AND NOT (c.handback_seq IS NOT DISTINCT FROM d.seq AND c.handback_delivery = d.delivery - 1) AS unaccounted
	            FROM cur c JOIN unnest($1::uuid[], $4::bigint[], $5::int[], $8::text[]) AS d(id, seq, delivery, pref) USING (id)) x) cur
	WHERE o.id = cur.id
	  AND (cur.status = 'pending' OR expiring OR suppressing
	       OR (cur.status = 'queued' AND cur.next_attempt_at <= clock_timestamp() + interval '1 second')
	       OR (cur.status = 'sending' AND (mine OR cur.lease_until <= clock_timestamp())))
	RETURNING o.id, o.to_e164, o.body, o.attempt_count, o.max_attempts, o.publish_gen,
	          -- A scheduled row was published no sooner than its send time:
	          -- its age, for the broker's memory and the lookups, counts
	          -- from there.
	          greatest(o.created_at, o.send_at) AS created_at,
	          o.maybe_accepted, cur.mine, o.lookup_pending, o.lookups, o.provider, o.lookup_everywhere,
	          o.status, o.expires_at, cur.sup_source
)
SELECT cur.id, cur.status, cur.lease_until, cur.next_attempt_at, upd.id IS NOT NULL, coalesce(upd.mine, false),
       upd.to_e164, upd.body, upd.attempt_count, upd.max_attempts, upd.publish_gen, upd.created_at,
       coalesce(upd.maybe_accepted, false), coalesce(upd.lookup_pending, false), coalesce(upd.lookups, 0)::int,
       clock_timestamp(), coalesce(cur.claim_seq, 0), coalesce(cur.claim_delivery, 0), coalesce(upd.provider, ''),
       coalesce(upd.lookup_everywhere, false), coalesce(cur.handback_seq, 0), coalesce(cur.handback_delivery, 0),
       coalesce(upd.status, ''), upd.expires_at, coalesce(upd.sup_source, '')
FROM cur
LEFT JOIN upd ON upd.id = cur.id
