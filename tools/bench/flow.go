package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	store "github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/outbox"
)

// The flow-control scenarios: urgent messages behind a bulk backlog, and
// one provider rate limit shared by three senders.

const (
	// priorityLimit, priorityLatency and prioritySenders are the issue's
	// set-up: SMS_RATE_LIMIT=500, a 50 ms provider, 3 senders.
	priorityLimit   = 500
	priorityLatency = 50 * time.Millisecond
	prioritySenders = 3
	// urgentRate is how fast the urgent rows are enqueued.
	urgentRate = 10
	// sharedLimit is the ratelimit scenario's SMS_RATE_LIMIT and the stub's
	// tier: requests above it are answered 429.
	sharedLimit = 200
)

// priority: a backlog of bulk rows queued in JetStream and being sent at
// the shared limit, then urgent rows enqueued at 10/s through
// outbox.Enqueue. Commit time is when COMMIT returned; sent time is the sent
// row's updated_at (its status write).
func (b *bench) priority(ctx context.Context, rep *report) error {
	c := b.cfg
	e, err := b.newEnv(ctx, "priority", priorityLatency)
	if err != nil {
		return err
	}
	defer e.close()
	if err := b.copyRowsWith(ctx, c.bulkRows, "pending", outbox.Bulk); err != nil {
		return err
	}
	if _, err := e.startRelay(ctx); err != nil {
		return err
	}
	if err := b.waitUntil(ctx, 50*time.Millisecond, func() (bool, error) {
		pending, err := b.countStatus(ctx, "pending")
		return pending == 0, err
	}); err != nil {
		return fmt.Errorf("queue the bulk backlog: %w", err)
	}
	e.senderEnv = []string{fmt.Sprintf("SMS_RATE_LIMIT=%d", priorityLimit)}
	b.logf("[priority] %d bulk rows queued; starting %d senders (SMS_RATE_LIMIT=%d, stub latency %s)", c.bulkRows, prioritySenders, priorityLimit, priorityLatency)
	started, err := e.startSenders(ctx, prioritySenders)
	if err != nil {
		return err
	}
	// Let the bulk lane fill the limit before the urgent rows come.
	if err := b.waitUntil(ctx, 100*time.Millisecond, func() (bool, error) {
		st, err := e.stubStats(ctx)
		return st.Deliveries > priorityLimit*2 || time.Since(started) > 10*time.Second, err
	}); err != nil {
		return err
	}
	st0, err := e.stubStats(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	committed := make(map[uuid.UUID]time.Time, c.urgentRows)
	for i := range c.urgentRows {
		if d := time.Until(t0.Add(time.Duration(i) * time.Second / urgentRate)); d > 0 {
			time.Sleep(d)
		}
		var id uuid.UUID
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			id, err = outbox.Enqueue(ctx, tx, fmt.Sprintf("+1666%07d", i), fmt.Sprintf("Your sendonce code is %06d.", i), outbox.WithPriority(outbox.Urgent))
			return err
		})
		if err != nil {
			return fmt.Errorf("enqueue urgent row %d: %w", i, err)
		}
		committed[id] = time.Now()
	}
	ids := make([]uuid.UUID, 0, len(committed))
	for id := range committed {
		ids = append(ids, id)
	}
	sentAt, err := b.waitSentTimes(ctx, ids)
	if err != nil {
		return fmt.Errorf("wait for the urgent rows: %w", err)
	}
	st1, err := e.stubStats(ctx)
	if err != nil {
		return err
	}
	window := time.Since(t0)
	var lat []time.Duration
	for id, at := range committed {
		lat = append(lat, sentAt[id].Sub(at))
	}
	s := summarize(lat)
	bulkRate := float64(st1.Requests-st0.Requests) / window.Seconds()
	b.logf("[priority] %d urgent rows behind %d bulk: commit->sent p50 %.1f p99 %.1f ms; the provider saw %.0f requests/s meanwhile",
		len(ids), c.bulkRows, s.P50, s.P99, bulkRate)
	rep.add("priority", "urgent commit->sent p50, bulk backlog", s.P50, "ms")
	rep.addTarget("priority", fmt.Sprintf("urgent commit->sent p99, %d bulk queued, limit %d/s, %d senders", c.bulkRows, priorityLimit, prioritySenders), s.P99, "ms", "<=", 1000)
	rep.add("priority", "provider requests/s while urgent rows came", bulkRate, "req/s")
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: "priority", Rows: c.bulkRows + len(ids), Details: map[string]any{
		"urgent_commit_to_sent": s, "bulk_rows": c.bulkRows, "urgent_rows": len(ids), "urgent_per_second": urgentRate,
		"rate_limit": priorityLimit, "senders": prioritySenders, "stub_latency": priorityLatency.String(),
		"provider_requests_per_second": bulkRate,
	}})
	return nil
}

// waitSentTimes waits until every row of ids is sent and returns each
// one's sent time (its updated_at: the status write).
func (b *bench) waitSentTimes(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]time.Time, error) {
	sentAt := map[uuid.UUID]time.Time{}
	err := b.waitUntil(ctx, 50*time.Millisecond, func() (bool, error) {
		rows, _ := b.pool.Query(ctx, `SELECT id, updated_at FROM sms_outbox WHERE id = ANY($1) AND status = 'sent'`, ids)
		var id uuid.UUID
		var at time.Time
		_, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { sentAt[id] = at; return nil })
		return len(sentAt) == len(ids), err
	})
	return sentAt, err
}

// rateLimit: three senders with SMS_RATE_LIMIT=200 against a stub whose
// tier is 200/s (429 above it), sending a backlog that lasts about
// -ratelimit-duration. The stub's request count is sampled every second;
// each 10 s window of the steady part (after the senders have found each
// other, before the backlog runs dry) gives one rate.
func (b *bench) rateLimit(ctx context.Context, rep *report) error {
	c := b.cfg
	n := int(c.limitWindow.Seconds() * sharedLimit)
	e, err := b.newEnv(ctx, "ratelimit", 20*time.Millisecond, "-rate-limit", fmt.Sprint(sharedLimit))
	if err != nil {
		return err
	}
	defer e.close()
	if err := b.copyRows(ctx, n, "pending"); err != nil {
		return err
	}
	if _, err := e.startRelay(ctx); err != nil {
		return err
	}
	e.senderEnv = []string{fmt.Sprintf("SMS_RATE_LIMIT=%d", sharedLimit)}
	b.logf("[ratelimit] %d rows; starting 3 senders with SMS_RATE_LIMIT=%d against a stub that answers 429 above %d/s", n, sharedLimit, sharedLimit)
	if _, err := e.startSenders(ctx, 3); err != nil {
		return err
	}
	type sample struct {
		at       time.Time
		requests int64
	}
	var samples []sample
	show := throttle(5 * time.Second)
	if err := b.waitUntil(ctx, time.Second, func() (bool, error) {
		st, err := e.stubStats(ctx)
		if err != nil {
			return false, err
		}
		samples = append(samples, sample{time.Now(), st.Requests})
		if show() {
			b.logf("[ratelimit] %d requests, %d delivered, %d over the limit", st.Requests, st.Deliveries, st.OverLimit)
		}
		if st.Deliveries < int64(n) {
			return false, nil
		}
		sent, err := b.countStatus(ctx, "sent")
		return sent >= n, err
	}); err != nil {
		return err
	}
	stats, err := e.stubStats(ctx)
	if err != nil {
		return err
	}
	if err := checkOnce(stats.Deliveries, stats.Keys, n); err != nil {
		return err
	}
	// Steady part: from 3 s after the first request to the last sample
	// before 95 % of the rows were requested.
	var rates []float64
	first := -1
	for i, s := range samples {
		if s.requests > 0 && first < 0 {
			first = i
		}
	}
	for i := first + 3; first >= 0 && i+10 < len(samples); i += 10 {
		if samples[i+10].requests > int64(float64(n)*0.95) {
			break
		}
		rates = append(rates, float64(samples[i+10].requests-samples[i].requests)/samples[i+10].at.Sub(samples[i].at).Seconds())
	}
	worst := 0.0
	lo, hi := math.Inf(1), 0.0
	for _, r := range rates {
		worst = max(worst, math.Abs(r-sharedLimit)/sharedLimit*100)
		lo, hi = min(lo, r), max(hi, r)
	}
	lost, err := store.MiscountedAttempts(ctx, b.pool, nil)
	if err != nil {
		return fmt.Errorf("count attempts lost to 429s: %w", err)
	}
	share429 := 100 * float64(stats.OverLimit) / float64(max(1, stats.Requests))
	b.logf("[ratelimit] %d windows of 10 s: %.1f to %.1f requests/s (worst %.1f%% off %d); %d of %d requests 429 (%.2f%%); %d rows spent an attempt on a 429",
		len(rates), lo, hi, worst, sharedLimit, stats.OverLimit, stats.Requests, share429, lost)
	if len(rates) == 0 {
		return fmt.Errorf("no steady 10 s window in %d samples: lengthen -ratelimit-duration", len(samples))
	}
	rep.add("ratelimit", "provider requests/s, lowest 10 s window", lo, "req/s")
	rep.add("ratelimit", "provider requests/s, highest 10 s window", hi, "req/s")
	rep.addTarget("ratelimit", fmt.Sprintf("worst 10 s window off the shared limit %d/s, 3 senders", sharedLimit), worst, "%", "<=", 5)
	rep.addTarget("ratelimit", "429s of provider requests", share429, "%", "<=", 1)
	rep.addTarget("ratelimit", "rows that spent an attempt on a 429", float64(lost), "rows", "<=", 0)
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: "ratelimit", Rows: n, Details: map[string]any{
		"window_rates": rates, "limit": sharedLimit, "requests": stats.Requests, "over_limit": stats.OverLimit,
		"attempts_lost": lost, "senders": 3,
	}})
	return nil
}
