package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/smsstub"
)

// statusCounts counts the rows by status.
func (s *soak) statusCounts(ctx context.Context) (map[string]int, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, _ := s.pool.Query(qctx, `SELECT status, count(*) FROM sms_outbox GROUP BY status`)
	counts := map[string]int{}
	var st string
	var n int
	_, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { counts[st] = n; return nil })
	return counts, err
}

func terminal(counts map[string]int) int {
	return counts["sent"] + counts["delivered"] + counts["undelivered"] + counts["dead"] + counts["unknown"]
}

// progress prints a line to stderr every 2 seconds until progressStop.
func (s *soak) progress(ctx context.Context) {
	defer close(s.progressDone)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.progressStop:
			return
		case <-tick.C:
		}
		counts, err := s.statusCounts(ctx)
		if err != nil {
			s.logf("progress: %v", err)
			continue
		}
		up := 0
		for _, sl := range s.slots() {
			if sl.running() {
				up++
			}
		}
		inserted := 0
		if s.load != nil {
			inserted = s.load.committed()
		}
		settled := ""
		if s.lookups() {
			settled = fmt.Sprintf(" delivered %d undelivered %d", counts["delivered"], counts["undelivered"])
		}
		s.logf("inserted %d/%d | pending %d queued %d sending %d sent %d%s dead %d unknown %d | faults %d | processes up %d/%d, unexpected exits %d",
			inserted, s.cfg.rows, counts["pending"], counts["queued"], counts["sending"], counts["sent"], settled, counts["dead"], counts["unknown"],
			s.faults.total(), up, len(s.slots()), s.unexpected.Load())
	}
}

// waitTerminal waits until every committed row is terminal or timeout has
// passed; rows still not terminal then are counted as lost by check.
func (s *soak) waitTerminal(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	want := s.load.committed()
	if s.pgLost != nil {
		want -= len(s.pgLost.gone) // lost with an old primary: never to finish
	}
	for {
		counts, err := s.statusCounts(ctx)
		if err == nil && terminal(counts) >= want {
			return nil
		}
		if err != nil {
			s.logf("wait: %v", err)
		}
		if time.Now().After(deadline) {
			s.logf("DEADLINE: %d of %d rows not terminal after %s", want-terminal(counts), want, timeout)
			return nil
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// waitReceipts waits, after every row finished, until no sent row is
// waiting for a receipt the stub still tries to deliver (the sent rows,
// less those whose receipt an old primary took with it, are at most the
// receipts it gave up), or timeout has passed; the check then tells a
// receipt given up from one sendonce lost.
func (s *soak) waitReceipts(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	lostWithPrimary := []uuid.UUID{} // never NULL: id = ANY(NULL) excludes every row
	if s.pgLost != nil && !s.sweepsReceipts() {
		for id := range s.pgLost.receipts {
			lostWithPrimary = append(lostWithPrimary, id)
		}
	}
	for {
		var sent, settleable int64
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		// The sweep settles a row by its provider id at Twilio (a list
		// by number and text cannot tell which message is the row's).
		err := s.pool.QueryRow(qctx, `SELECT count(*), count(*) FILTER (WHERE provider_ref IS NOT NULL OR NOT $2)
			FROM sms_outbox WHERE status = 'sent' AND NOT (id = ANY($1))`,
			lostWithPrimary, s.twilio()).Scan(&sent, &settleable)
		cancel()
		if err != nil {
			return fmt.Errorf("count sent rows: %w", err)
		}
		st, err := s.stubStats(ctx)
		if err != nil {
			return err
		}
		switch {
		case s.sweepsReceipts() && settleable == 0:
			return nil
		case !s.sweepsReceipts() && sent <= st.ReceiptsGivenUp:
			return nil
		}
		if time.Now().After(deadline) {
			s.logf("%d rows still sent %s after every row finished (the stub gave up %d receipts and lost %d; %d more were lost with an old primary)",
				sent, timeout, st.ReceiptsGivenUp, st.ReceiptsLost, len(lostWithPrimary))
			return nil
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// badRow is a row that breaks an invariant.
type badRow struct {
	id         uuid.UUID
	status     string
	attempts   int
	deliveries int
	why        string
}

// result is what the end of the soak found.
type result struct {
	rows             int
	faults           string
	sent, dead, unkn int
	dups             []badRow // keys delivered more than once
	lost             []badRow // rows not terminal, missing, or sent without a delivery
	foreign          []string // stub keys that are no row id
	extraRows        int      // rows in the table the writers did not commit
	refMismatch      []badRow // sent rows whose provider_ref is not the stub's id
	deadDelivered    []badRow // dead rows the provider did deliver: the application was told nothing went out
	unknownDelivered int      // unknown rows the provider did deliver (unknown allows it)
	noLetter         []badRow // dead or unknown rows without a dead letter
	deadEarly        []badRow // dead for max_attempts with attempts left: a budget spent by something that was not an attempt
	unknownForbidden []badRow // unknown rows in a soak whose faults cannot make one, or whose lookups settle them
	// -provider lookup and twilio
	lookups          bool
	twilio           bool // the stub counts pages of its lists as lookups
	delivered, undel int
	wrongFate        []badRow // delivered or undelivered, but not as the stub decided
	receiptLost      []badRow // sent, though the receiver acknowledged the row's receipt
	// receiptWithPrimary counts rows left sent whose acknowledged receipt
	// was written on an old primary and lost with it (a failover).
	receiptWithPrimary int
	deadReasons        map[string]int
	stats              smsstub.Stats
	unexpected, unterm int64
	cpMissed           int64
	// miscounted counts the rows whose attempt_count the attempts log does
	// not explain (outbox.MiscountedAttempts; where the senders look up).
	miscounted      int
	goneWithPrimary int // committed rows a promoted standby never had (a failover)
	// failovers is the second line of a soak whose pg_failover faults
	// happened: what the old primaries took with them.
	failovers string
}

func (r *result) failed() bool {
	return len(r.dups) > 0 || len(r.lost) > 0 || len(r.foreign) > 0 || len(r.deadDelivered) > 0 || len(r.noLetter) > 0 ||
		len(r.deadEarly) > 0 || len(r.unknownForbidden) > 0 || len(r.wrongFate) > 0 || len(r.receiptLost) > 0 ||
		r.miscounted > 0
}

// line is the soak's one-line verdict.
func (r *result) line(wall time.Duration) string {
	if r.lookups {
		lookups := "lookups"
		if r.twilio {
			lookups = "lookup pages"
		}
		return fmt.Sprintf("soak: rows %d; faults %s; delivered %d, undelivered %d, sent %d, dead %d, unknown %d; duplicates %d; dead but delivered %d; wrong fate %d; receipts lost %d; lost %d; %s %d, receipts %d (given up %d); wall %s",
			r.rows, r.faults, r.delivered, r.undel, r.sent, r.dead, r.unkn, len(r.dups), len(r.deadDelivered), len(r.wrongFate), len(r.receiptLost),
			len(r.lost), lookups, r.stats.Lookups, r.stats.ReceiptsSent, r.stats.ReceiptsGivenUp, wall.Round(time.Second))
	}
	return fmt.Sprintf("soak: rows %d; faults %s; sent %d, dead %d, unknown %d; duplicates %d; dead but delivered %d; lost %d; wall %s",
		r.rows, r.faults, r.sent, r.dead, r.unkn, len(r.dups), len(r.deadDelivered), len(r.lost), wall.Round(time.Second))
}

// check compares every committed row with the stub's deliveries.
func (s *soak) check(ctx context.Context) (*result, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	deliveries, err := smsstub.FetchDeliveries(cctx, s.stub.url)
	if err != nil {
		return nil, err
	}
	stats, err := smsstub.FetchStats(cctx, s.stub.url)
	if err != nil {
		return nil, err
	}
	table := map[uuid.UUID]dbRow{}
	rows, _ := s.pool.Query(cctx, `SELECT id, status, coalesce(provider_ref, ''), coalesce(last_error, ''), coalesce(end_reason, ''),
		attempt_count, max_attempts FROM sms_outbox`)
	var id uuid.UUID
	var r dbRow
	if _, err := pgx.ForEachRow(rows, []any{&id, &r.status, &r.ref, &r.lastErr, &r.reason, &r.attempts, &r.maxAttempts}, func() error {
		table[id] = r
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read rows: %w", err)
	}

	lettered, err := s.letteredRows(cctx)
	if err != nil {
		return nil, err
	}

	res := &result{faults: s.faults.summary(), stats: stats, deadReasons: map[string]int{}, lookups: s.lookups(), twilio: s.twilio(),
		unexpected: s.unexpected.Load(), unterm: s.termUnclean.Load(), cpMissed: s.cpMissed.Load()}
	ids := s.load.committedIDs()
	res.rows = len(ids)
	ours := make(map[string]bool, len(ids))
	for _, id := range ids {
		ours[id.String()] = true
		row, ok := table[id]
		res.classify(id, row, ok, deliveries[id.String()], lettered[id], s.cfg.provider,
			s.pgLost != nil && s.pgLost.gone[id], s.pgLost != nil && s.pgLost.receipts[id], s.sweepsReceipts())
	}
	for key := range deliveries {
		if !ours[key] {
			res.foreign = append(res.foreign, key)
		}
	}
	if s.lookups() {
		// Lookups, refunds and deferrals at a provider without
		// idempotency: only a call spends an attempt.
		if res.miscounted, err = outbox.MiscountedAttempts(cctx, s.pool, ids); err != nil {
			return nil, fmt.Errorf("count miscounted attempts: %w", err)
		}
		s.logf("attempts: %d rows whose attempt_count does not match their attempts log", res.miscounted)
	}
	sort.Strings(res.foreign)
	for id := range table {
		if !ours[id.String()] {
			res.extraRows++
		}
	}
	s.failoverNotes(deliveries)
	if s.drill == nil && s.pgLost != nil && s.pgLost.failovers > 0 {
		res.failovers = s.failoverLine(deliveries, res.receiptWithPrimary)
	}
	if res.receiptWithPrimary > 0 {
		s.logf("note: %d rows stay sent whose receipt the receiver had written on an old primary (lost with it; the provider does not send it again)", res.receiptWithPrimary)
		if s.drill != nil {
			s.drill.note("%d rows stay sent: their receipts were written on the old primary only", res.receiptWithPrimary)
		}
	}
	if res.goneWithPrimary > 0 {
		s.logf("note: %d committed rows were lost with an old primary (asynchronous replication); not counted as lost by the pipeline", res.goneWithPrimary)
	}
	s.logf("provider: %d requests, %d deliveries, %d replays, %d withheld, %d injected failures, %d rate-limited, %d conflicts",
		stats.Requests, stats.Deliveries, stats.Replays, stats.Withheld, stats.Failures, stats.RateLimited, stats.Conflicts)
	if res.lookups {
		ev, err := s.evidenceCounts(cctx)
		if err != nil {
			return nil, err
		}
		s.logf("evidence: %d lookups (%d failed), %d receipts answered 2xx (%d tries failed, %d given up); recorded: %s",
			stats.Lookups, stats.LookupFailures, stats.ReceiptsSent, stats.ReceiptFailures, stats.ReceiptsGivenUp, ev)
	}
	if s.cfg.provider == providerFailover || s.cfg.provider == providerPair {
		line, err := s.providerShares(cctx)
		if err != nil {
			return nil, err
		}
		s.logf("providers: %s", line)
	}
	if res.twilio {
		least, most, numbers := perNumber(deliveries)
		s.logf("twilio: %d numbers; %d to %d messages to one (a lookup of the most read %d pages of 100, and the first again; the adapter reads at most %d)",
			numbers, least, most, (most+99)/100, provider.DefaultTwilioLookupPages)
	}
	s.logf("processes: %d unexpected exits, %d unclean SIGTERM exits, %d crash points armed but not reached",
		res.unexpected, res.unterm, res.cpMissed)
	if res.dead > 0 {
		s.logf("dead rows by last error: %s", formatReasons(res.deadReasons))
	}
	if n := res.dead + res.unkn; n > 0 {
		s.logf("dead letters: %d of the %d dead or unknown rows have one", n-len(res.noLetter), n)
	}
	if res.unknownDelivered > 0 {
		s.logf("note: %d of the unknown rows were delivered by the provider (an attempt may have been accepted, then attempts ran out; a replay with the same key finds out)", res.unknownDelivered)
	}
	if res.extraRows > 0 {
		s.logf("note: %d rows in the table were not committed by the writers as far as they know", res.extraRows)
	}
	if len(res.refMismatch) > 0 {
		s.logf("WARNING: %d sent rows carry a provider_ref that is not the stub's id for the key, e.g. %s: %s",
			len(res.refMismatch), res.refMismatch[0].id, res.refMismatch[0].why)
	}
	return res, nil
}

// perNumber counts the messages the stub took to each number: the fewest
// and the most to one, and the numbers. Numbers are not logged.
func perNumber(deliveries map[string]smsstub.Delivery) (least, most, numbers int) {
	per := map[string]int{}
	for _, d := range deliveries {
		if d.To != "" {
			per[d.To] += d.Deliveries
		}
	}
	for _, n := range per {
		if least == 0 || n < least {
			least = n
		}
		most = max(most, n)
	}
	return least, most, len(per)
}

// evidenceCounts sums the recorded receipts and lookups by kind and
// result, as "lookup found 120, receipt delivered 4500, ...".
func (s *soak) evidenceCounts(ctx context.Context) (string, error) {
	rows, _ := s.pool.Query(ctx, `SELECT kind || ' ' || result, count(*) FROM sms_evidence GROUP BY 1 ORDER BY 1`)
	var parts []string
	var k string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { parts = append(parts, fmt.Sprintf("%s %d", k, n)); return nil }); err != nil {
		return "", fmt.Errorf("count evidence: %w", err)
	}
	if len(parts) == 0 {
		return "none", nil
	}
	return strings.Join(parts, ", "), nil
}

// dbRow is a row as the check reads it.
type dbRow struct {
	status, ref, lastErr, reason string
	attempts, maxAttempts        int
}

// classify counts one committed row (ok: it is in the table; d: the stub's
// record of its key; lettered: its dead letter is stored; gone: it was lost
// with an old primary in a failover; receiptGone: an old primary held it
// delivered or undelivered, the promoted standby did not) and records what
// it breaks.
func (r *result) classify(id uuid.UUID, row dbRow, ok bool, d smsstub.Delivery, lettered bool, provider string, gone, receiptGone, sweep bool) {
	b := badRow{id: id, status: row.status, attempts: row.attempts, deliveries: d.Deliveries}
	if d.Deliveries > 1 {
		b.why = "delivered more than once"
		r.dups = append(r.dups, b)
	}
	switch {
	case !ok && gone:
		// Committed on the old primary, never replicated: lost with
		// it (the drill reports them), not by the pipeline.
		r.goneWithPrimary++
	case !ok:
		b.status, b.why = "missing", "committed row is gone"
		r.lost = append(r.lost, b)
	case row.status == "sent" || row.status == "delivered" || row.status == "undelivered":
		switch row.status {
		case "sent":
			r.sent++
		case "delivered":
			r.delivered++
		default:
			r.undel++
		}
		switch {
		case d.Deliveries == 0:
			b.why = row.status + " but never delivered"
			r.lost = append(r.lost, b)
		case row.status == "sent" && d.Fate != "" && sweep && ((provider != providerTwilio && provider != providerFailover) || row.ref != ""):
			// Whatever became of its receipt (never sent, given up,
			// lost with an old primary), the senders' sweep asks the
			// provider once it is overdue.
			b.why = "sent, though the provider decided " + d.Fate + " and the overdue-receipt sweep had time to ask"
			r.receiptLost = append(r.receiptLost, b)
		case row.status == "sent" && d.ReceiptAcked && receiptGone:
			// The receipt was written on an old primary and lost with
			// it: asynchronous replication's price, reported where no
			// sweep asks (a drill on the defaults' hour).
			r.receiptWithPrimary++
		case row.status == "sent" && d.ReceiptAcked:
			b.why = "sent, though the receiver acknowledged its " + d.Fate + " receipt"
			r.receiptLost = append(r.receiptLost, b)
		case row.status != "sent" && row.status != d.Fate:
			b.why = fmt.Sprintf("%s, but the provider decided %q", row.status, d.Fate)
			r.wrongFate = append(r.wrongFate, b)
		case row.ref != d.ProviderID:
			b.why = fmt.Sprintf("provider_ref %q, stub id %q", row.ref, d.ProviderID)
			r.refMismatch = append(r.refMismatch, b)
		}
	case row.status == "dead" || row.status == "unknown":
		if row.status == "dead" {
			r.dead++
			r.deadReasons[reasonOf(row.lastErr)]++
			if d.Deliveries > 0 {
				b.why = "dead, but the provider delivered it"
				r.deadDelivered = append(r.deadDelivered, b)
			}
			if row.reason == "max_attempts" && row.attempts < row.maxAttempts {
				b.why = fmt.Sprintf("dead for max_attempts after %d of %d attempts", row.attempts, row.maxAttempts)
				r.deadEarly = append(r.deadEarly, b)
			}
		} else {
			r.unkn++
			if d.Deliveries > 0 {
				r.unknownDelivered++
			}
			switch provider {
			case providerNonIdempotent, providerPair:
				b.why = "unknown, though no fault drawn can make an outcome unknown: " + row.lastErr
				r.unknownForbidden = append(r.unknownForbidden, b)
			case providerLookup, providerTwilio, providerFailover:
				b.why = "unknown, though lookups settle every unanswered attempt: " + row.lastErr
				r.unknownForbidden = append(r.unknownForbidden, b)
			}
		}
		if !lettered {
			b.why = "finished " + row.status + " without a dead letter"
			r.noLetter = append(r.noLetter, b)
		}
	default:
		b.why = "not terminal at the deadline"
		r.lost = append(r.lost, b)
	}
}

// waitLetters waits until every dead or unknown row has its dead letter
// recorded (the sender publishes it after the status; the reconciler
// publishes those whose sender died in between), at most timeout; what is
// still missing then shows in the check.
func (s *soak) waitLetters(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE status IN ('dead', 'unknown') AND letter_seq IS NULL`).Scan(&n); err != nil {
			return fmt.Errorf("count rows without their dead letter: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			s.logf("%d dead or unknown rows still have no dead letter recorded after %s", n, timeout)
			return nil
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// letteredRows returns the rows that have a dead letter on the broker.
func (s *soak) letteredRows(ctx context.Context) (map[uuid.UUID]bool, error) {
	nc, err := nats.Connect(s.natsURL(), nats.Name("sendonce-soak-check"))
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	letters, err := deadletter.List(ctx, js, "", deadletter.Filter{})
	if err != nil {
		return nil, err
	}
	out := make(map[uuid.UUID]bool, len(letters))
	for _, l := range letters {
		out[l.OutboxID] = true
	}
	return out, nil
}

// reasonOf shortens a last_error to its leading words, digits removed, for
// grouping.
func reasonOf(lastErr string) string {
	s := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '#'
		}
		return r
	}, lastErr)
	if len(s) > 80 {
		s = s[:80]
	}
	if s == "" {
		s = "(none)"
	}
	return s
}

func formatReasons(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d × %q", m[k], k))
	}
	return strings.Join(parts, "; ")
}

// bad returns every row that breaks an invariant, by kind.
func (r *result) bad() []badRow {
	var bad []badRow
	for _, l := range [][]badRow{r.dups, r.lost, r.deadDelivered, r.noLetter, r.deadEarly, r.unknownForbidden, r.wrongFate, r.receiptLost} {
		bad = append(bad, l...)
	}
	return bad
}

// diagnose prints the offending rows and the trace of a few of them.
func (s *soak) diagnose(ctx context.Context, res *result) {
	bad := res.bad()
	for i, b := range bad {
		if i == 20 {
			s.logf("... and %d more", len(bad)-20)
			break
		}
		s.logf("BAD ROW %s: %s (status %s, attempts %d, deliveries at the stub %d)", b.id, b.why, b.status, b.attempts, b.deliveries)
	}
	for i, k := range res.foreign {
		if i == 20 {
			s.logf("... and %d more", len(res.foreign)-20)
			break
		}
		s.logf("FOREIGN KEY at the stub: %q is no row id", k)
	}
	for i, b := range bad {
		if i == 5 {
			break
		}
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := proc.Run(tctx, filepath.Join(s.cfg.binDir, "relay"), []string{"trace", b.id.String()},
			[]string{"DATABASE_URL=" + s.directURL, "NATS_URL=" + s.natsURL(), "LOG_FORMAT=text"})
		cancel()
		path := filepath.Join(s.logDir, "trace-"+b.id.String()+".txt")
		_ = os.WriteFile(path, out, 0o644)
		s.logf("relay trace %s (err %v; saved in %s):\n%s", b.id, err, path, out)
	}
}

// providerShares says how the rows split between the providers of
// SMS_PROVIDERS, and how many moved from one to the next.
func (s *soak) providerShares(ctx context.Context) (string, error) {
	rows, err := s.pool.Query(ctx, `SELECT coalesce(provider, 'none'), count(*) FROM sms_outbox GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return "", fmt.Errorf("count rows by provider: %w", err)
	}
	var parts []string
	for rows.Next() {
		var p string
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			rows.Close()
			return "", err
		}
		parts = append(parts, fmt.Sprintf("%s %d", p, n))
	}
	rows.Close()
	var moved int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM sms_attempts WHERE outcome = 'retry' AND error LIKE 'not taken, moved to %'`).Scan(&moved); err != nil {
		return "", fmt.Errorf("count moves: %w", err)
	}
	return fmt.Sprintf("rows by provider: %s; %d moved to the next provider", strings.Join(parts, ", "), moved), nil
}
