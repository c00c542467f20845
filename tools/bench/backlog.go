package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/outbox"
)

// The backlog scenario: an outage's backlog, -backlog-rows (1,000,000)
// pending rows written before the senders and the relay start, drained
// against the stub without latency while urgent rows are enqueued at
// urgentRate through outbox.Enqueue; against it, a backlog of
// -backlog-small (10,000) drained the same way. Figures: each drain's
// rate and their ratio, the processes' peak RSS, the urgent rows'
// commit->sent, and the redeliveries (the lanes' consumers' deliveries
// beyond the stream's messages).

// backlogDrain is one drain of the backlog scenario.
type backlogDrain struct {
	Rows int     `json:"rows"`
	Rate float64 `json:"messages_per_second"`
	// Urgent is the urgent rows' commit->sent; UrgentRows how many came.
	Urgent     latencySummary `json:"urgent_commit_to_sent"`
	UrgentRows int            `json:"urgent_rows"`
	// Deliveries is what the lanes' consumers delivered, Messages what
	// the stream holds; Redelivered the difference.
	Deliveries  int64 `json:"consumer_deliveries"`
	Messages    int64 `json:"stream_messages"`
	Redelivered int64 `json:"redelivered"`
	// PeakMB is each process's peak RSS (VmHWM).
	PeakMB map[string]float64 `json:"peak_rss_mb"`
	PG     *pgActivity        `json:"postgres,omitempty"`
	CPU    cpuSplit           `json:"cpu"`
	Flow   *flowCount         `json:"flow,omitempty"`
	Memory map[string]memory  `json:"-"`
}

// drainBacklog writes n pending rows with COPY, starts the senders and
// then the relay, and enqueues urgent rows at urgentRate until the
// backlog is sent.
func (b *bench) drainBacklog(ctx context.Context, rep *report, name string, n int) (*backlogDrain, error) {
	c := b.cfg
	e, err := b.newEnv(ctx, name, 0)
	if err != nil {
		return nil, err
	}
	defer e.close()
	metricsURL, err := e.relayMetrics()
	if err != nil {
		return nil, err
	}
	t := time.Now()
	if err := b.copyRowsWith(ctx, n, "pending", outbox.Normal); err != nil {
		return nil, err
	}
	b.logf("[%s] %d pending rows written in %s; starting %d senders, then the relay", name, n, since(t), c.senders)
	if _, err := e.startSenders(ctx, c.senders); err != nil {
		return nil, err
	}
	pg0, cpu0 := b.samplePG(ctx), b.sampleCPU()
	started, err := e.startRelay(ctx)
	if err != nil {
		return nil, err
	}

	// The urgent rows, until the backlog is sent.
	var (
		mu        sync.Mutex
		committed = map[uuid.UUID]time.Time{}
		werr      error
	)
	wctx, stopWriting := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		for i := 0; ; i++ {
			select {
			case <-wctx.Done():
				return
			case <-time.After(time.Until(t0.Add(time.Duration(i) * time.Second / urgentRate))):
			}
			var id uuid.UUID
			err := pgx.BeginFunc(wctx, b.pool, func(tx pgx.Tx) error {
				var err error
				id, err = outbox.Enqueue(wctx, tx, fmt.Sprintf("+1667%07d", i), fmt.Sprintf("Your sendonce code is %06d.", i), outbox.WithPriority(outbox.Urgent))
				return err
			})
			at := time.Now()
			mu.Lock()
			if err != nil {
				if wctx.Err() == nil {
					werr = fmt.Errorf("enqueue urgent row %d: %w", i, err)
				}
				mu.Unlock()
				return
			}
			committed[id] = at
			mu.Unlock()
		}
	}()
	show := throttle(5 * time.Second)
	err = b.waitUntil(ctx, 200*time.Millisecond, func() (bool, error) {
		mu.Lock()
		err := werr
		mu.Unlock()
		if err != nil {
			return false, err
		}
		st, err := e.stubStats(ctx)
		if err != nil {
			return false, err
		}
		if show() {
			b.logf("[%s] %5.1fs  delivered %d of %d (and urgent rows)", name, time.Since(started).Seconds(), st.Deliveries, n)
		}
		if st.Deliveries < int64(n) {
			return false, nil
		}
		var sent int
		b.polls.Add(1)
		err = b.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE status = 'sent' AND priority = $1`, int16(outbox.Normal)).Scan(&sent)
		return sent >= n, err
	})
	stopWriting()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	d := &backlogDrain{Rows: n, PeakMB: map[string]float64{}}
	d.CPU = b.sampleCPU().since(cpu0)
	d.Memory = b.memories()
	for p, m := range d.Memory {
		d.PeakMB[p] = m.PeakMB
	}
	mu.Lock()
	ids := make([]uuid.UUID, 0, len(committed))
	for id := range committed {
		ids = append(ids, id)
	}
	mu.Unlock()
	// The last urgent rows may still be on their way.
	sentAt, err := b.waitSentTimes(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("wait for the urgent rows: %w", err)
	}
	stats, err := e.stubStats(ctx)
	if err != nil {
		return nil, err
	}
	if d.Flow, err = e.countFlow(ctx, metricsURL); err != nil {
		return nil, err
	}
	d.PG = b.finishPG(ctx, name, pg0, d.CPU, n+len(ids))
	if err := checkOnce(stats.Deliveries, stats.Keys, n+len(ids)); err != nil {
		return nil, err
	}
	var last time.Time
	if err := b.pool.QueryRow(ctx, `SELECT max(updated_at) FROM sms_outbox WHERE status = 'sent' AND priority = $1`, int16(outbox.Normal)).Scan(&last); err != nil {
		return nil, fmt.Errorf("read the last sent row: %w", err)
	}
	d.Rate = float64(n) / last.Sub(started).Seconds()
	var lat []time.Duration
	for _, id := range ids {
		lat = append(lat, sentAt[id].Sub(committed[id]))
	}
	d.Urgent, d.UrgentRows = summarize(lat), len(ids)
	d.Deliveries, d.Messages = d.Flow.Deliveries, d.Flow.StreamMessages
	d.Redelivered = max(0, d.Deliveries-d.Messages)
	b.logf("[%s] %d messages sent in %s: %.0f msg/s; %d urgent rows meanwhile, commit->sent p50 %.1f p99 %.1f ms; %d deliveries of %d messages",
		name, n, last.Sub(started).Round(time.Millisecond), d.Rate, len(ids), d.Urgent.P50, d.Urgent.P99, d.Deliveries, d.Messages)
	b.logf("[%s] cpu: %s", name, d.CPU)
	rep.Scenarios = append(rep.Scenarios, scenarioReport{Name: name, Rows: n + len(ids), CPU: d.CPU, Memory: d.Memory, Postgres: d.PG, Details: map[string]any{"backlog": d}})
	return d, nil
}

// backlogReport is the backlog scenario in bench.json.
type backlogReport struct {
	Method string `json:"method"`
	// Small holds the small backlog's drains (-runs of them), SmallRate
	// their median rate; Large is the large backlog's drain.
	Small      []*backlogDrain `json:"small"`
	SmallRate  float64         `json:"small_rate"`
	Large      *backlogDrain   `json:"large"`
	Ratio      float64         `json:"ratio"`
	Autovacuum string          `json:"autovacuum"`
}

// backlog drains the small backlog -runs times (a few seconds each, so
// the median of several), then the large one once.
func (b *bench) backlog(ctx context.Context, rep *report) error {
	c := b.cfg
	br := &backlogReport{Method: fmt.Sprintf("each backlog written with COPY (pending, normal priority) before %d senders and then a relay start, the stub without latency; "+
		"urgent rows enqueued through outbox.Enqueue at %d/s from the relay's start until the backlog is sent; rate: backlog rows over relay start to the last one's sent time; "+
		"the small backlog drained -runs times (its median rate), the large once", c.senders, urgentRate)}
	if err := b.pool.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&br.Autovacuum); err != nil {
		return err
	}
	var rates []float64
	for run := 1; run <= c.runs; run++ {
		d, err := b.drainBacklog(ctx, rep, fmt.Sprintf("backlog-small-%d", run), c.backlogSmall)
		b.stopAll()
		if err != nil {
			return fmt.Errorf("%d rows: %w", c.backlogSmall, err)
		}
		br.Small = append(br.Small, d)
		rates = append(rates, d.Rate)
	}
	br.SmallRate = median(rates)
	var err error
	if br.Large, err = b.drainBacklog(ctx, rep, "backlog-large", c.backlogRows); err != nil {
		return fmt.Errorf("%d rows: %w", c.backlogRows, err)
	}
	br.Ratio = ratio(br.Large.Rate, br.SmallRate)
	rep.Backlog = br
	l, s := br.Large, br.Small[0]
	b.logf("[backlog] %d rows: median %.0f msg/s of %v; %d rows: %.0f msg/s; %.2fx; autovacuum %s", s.Rows, br.SmallRate, roundAll(rates), l.Rows, l.Rate, br.Ratio, br.Autovacuum)
	rep.add("backlog", fmt.Sprintf("drain %s pending->sent, median of %d", thousands(int64(s.Rows)), len(rates)), br.SmallRate, "msg/s")
	rep.add("backlog", fmt.Sprintf("drain %s pending->sent", thousands(int64(l.Rows))), l.Rate, "msg/s")
	rep.addTarget("backlog", fmt.Sprintf("%s / %s rows", thousands(int64(l.Rows)), thousands(int64(s.Rows))), br.Ratio, "x", ">=", 0.9)
	rep.addTarget("backlog", fmt.Sprintf("urgent commit->sent p99 during the %s drain, %d/s", thousands(int64(l.Rows)), urgentRate), l.Urgent.P99, "ms", "<=", 1000)
	rep.addTarget("backlog", fmt.Sprintf("redeliveries, %s drain", thousands(int64(l.Rows))), 100*float64(l.Redelivered)/float64(max(1, l.Messages)), "%", "<=", 1)
	for _, role := range []string{"relay", "sender"} {
		peak := 0.0
		for p, mb := range l.PeakMB {
			if procRole(p) == role {
				peak = max(peak, mb)
			}
		}
		rep.add("backlog", fmt.Sprintf("%s peak RSS (VmHWM), %s drain", role, thousands(int64(l.Rows))), peak, "MB")
	}
	var cpu []float64
	for _, d := range br.Small {
		if d.PG != nil {
			cpu = append(cpu, d.PG.CPUMicrosPerMsg)
		}
	}
	if l.PG != nil && len(cpu) > 0 {
		rep.add("backlog", fmt.Sprintf("postgres CPU per message, %s / %s", thousands(int64(l.Rows)), thousands(int64(s.Rows))), ratio(l.PG.CPUMicrosPerMsg, median(cpu)), "x")
	}
	return nil
}
