WITH locked AS (
	SELECT id FROM sms_outbox WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE sms_outbox o
SET -- dead is a promise that nothing reached the provider: a row an attempt
    -- may have reached ends unknown, whatever an older sender decided
    -- (the table refuses dead with maybe_accepted).
    -- A lookup that found no message for the reference (notacc) clears the
    -- mark: no earlier attempt reached the provider.
    -- expired likewise promises that no call was taken, at the expiry by
    -- the database's clock: a row not yet due by it (a sender whose clock
    -- runs ahead) or marked meanwhile waits, parked, for the claim after
    -- its expiry, which settles it (the table refuses the move).
    status = CASE WHEN v.status = 'dead' AND ((o.maybe_accepted AND NOT v.notacc) OR v.maybe) THEN 'unknown'
                  WHEN (v.status = 'expired' AND (o.expires_at IS NULL OR o.expires_at > clock_timestamp() OR (o.maybe_accepted AND NOT v.notacc) OR v.maybe)) THEN 'queued'
                  ELSE v.status END,
    provider_ref = CASE WHEN v.status IN ('sent', 'delivered', 'undelivered') THEN coalesce(nullif(v.ref, ''), o.provider_ref)
                        ELSE o.provider_ref END,
    last_error = CASE WHEN v.status IN ('sent', 'delivered', 'undelivered') THEN NULL ELSE v.err END,
    end_reason = CASE WHEN v.status = 'dead' AND ((o.maybe_accepted AND NOT v.notacc) OR v.maybe) THEN 'ambiguous'
                      WHEN v.status IN ('dead', 'unknown') THEN v.reason END,
    next_attempt_at = CASE WHEN v.status = 'queued'
                           THEN clock_timestamp() + v.delay * interval '1 second'
                           WHEN (v.status = 'expired' AND (o.expires_at IS NULL OR o.expires_at > clock_timestamp() OR (o.maybe_accepted AND NOT v.notacc) OR v.maybe))
                           THEN greatest(coalesce(o.expires_at, clock_timestamp()), clock_timestamp())
                           ELSE o.next_attempt_at END,
    stream_seq = CASE WHEN (v.status = 'queued' AND v.park) OR (v.status = 'expired' AND (o.expires_at IS NULL OR o.expires_at > clock_timestamp() OR (o.maybe_accepted AND NOT v.notacc) OR v.maybe)) THEN NULL ELSE o.stream_seq END,
    maybe_accepted = (o.maybe_accepted AND NOT v.notacc) OR v.maybe,
    -- A refund gives the claim's attempt back: the provider took nothing
    -- (429), or the claim only looked the message up. The provider's word
    -- is also written over a row a receipt moved on meanwhile (delivered
    -- over sent): the claim that counted the attempt (its token is still
    -- the row's) gives it back, and clears the claim, so that a write run
    -- again gives nothing back twice (refundMissed does the same).
    attempt_count = CASE WHEN v.refund AND (o.status = 'sending' OR (o.claim_id = v.token AND v.status IN ('sent', 'delivered', 'undelivered')))
                         THEN greatest(o.attempt_count - 1, 0) ELSE o.attempt_count END,
    claim_id = CASE WHEN v.refund AND o.status <> 'sending' AND o.claim_id = v.token AND v.status IN ('sent', 'delivered', 'undelivered')
                    THEN NULL ELSE o.claim_id END,
    lookup_pending = (v.status = 'queued' AND v.lookup)
                     OR ((v.status = 'expired' AND (o.expires_at IS NULL OR o.expires_at > clock_timestamp() OR (o.maybe_accepted AND NOT v.notacc) OR v.maybe)) AND ((o.maybe_accepted AND NOT v.notacc) OR v.maybe)),
    lookups = CASE WHEN o.status = 'sending' THEN o.lookups + v.failed ELSE o.lookups END,
    sent_at = CASE WHEN v.status IN ('sent', 'delivered', 'undelivered') THEN coalesce(o.sent_at, clock_timestamp())
                   ELSE o.sent_at END,
    provider = coalesce(nullif(v.prov, ''), o.provider),
    lookup_everywhere = coalesce(v.everywhere, o.lookup_everywhere),
    updated_at = clock_timestamp()
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::float8[], $7::bool[], $8::uuid[], $9::bool[],
            $10::bool[], $11::bool[], $12::int[], $13::bool[], $14::text[], $15::bool[])
         AS v(id, status, ref, err, reason, delay, park, token, maybe, refund, lookup, failed, notacc, prov, everywhere)
     JOIN locked USING (id)
WHERE o.id = v.id
  AND CASE -- The provider's own word (an answer, a lookup) is evidence: it is
           -- written over any unfinished status, over unknown, and (an
           -- answer that a row's dead contradicts) over dead; a delivery
           -- report over sent; never over delivered or undelivered.
           -- (Over expired, cancelled and suppressed too: a failover can lose the
           -- writes that showed an attempt, and the row then ended as if
           -- none had been made.)
           WHEN v.status = 'sent' THEN o.status IN ('pending', 'queued', 'sending', 'unknown', 'dead', 'expired', 'cancelled', 'suppressed')
           WHEN v.status IN ('delivered', 'undelivered') THEN o.status IN ('pending', 'queued', 'sending', 'unknown', 'sent', 'expired', 'cancelled', 'suppressed')
           ELSE o.claim_id = v.token AND o.status IN ('sending', v.status, CASE WHEN v.status = 'dead' THEN 'unknown' END) END
  -- Suppressed only while the number is on the list (the trigger's rule):
  -- one an operator removed since the claim is put back (requeueUnlisted).
  AND (v.status <> 'suppressed' OR EXISTS (SELECT 1 FROM sms_suppressions s WHERE s.number OPERATOR(pg_catalog.=) o.to_e164))
RETURNING o.id, o.publish_gen, o.attempt_count, coalesce(o.end_reason, '')
