package sender

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
)

// Defaults of ReceiptSweepConfig, exported so that the command's flags show
// the same.
const (
	// DefaultReceiptOverdue is the command's SENDER_RECEIPT_OVERDUE: a
	// provider reports most messages' fate within seconds and nearly all
	// within minutes (a handset that is off is retried by the carrier for
	// longer, and reported undelivered then), so an hour without a
	// receipt means the receipt is lost, not late, while the receiver may
	// be down that long and still get it (the stub retries a receipt ten
	// times, Twilio a few).
	DefaultReceiptOverdue = time.Hour
	// DefaultReceiptOverdueLooks is how many times a row is looked up:
	// with DefaultReceiptOverdue, at 1, 2, 4, 8 and 16 hours after it was
	// sent, all within the provider's lookup retention (24 hours).
	DefaultReceiptOverdueLooks = 5
	// DefaultReceiptOverdueRate is how many lookups a second one sender's
	// sweep makes at most: 3,600 rows an hour, far more receipts than are
	// normally lost, and a trickle beside the sends.
	DefaultReceiptOverdueRate = 1.0
	// DefaultReceiptSweepInterval is the time between two passes.
	DefaultReceiptSweepInterval = 30 * time.Second
	// MaxReceiptOverdueDelay bounds the time between two looks at a row.
	MaxReceiptOverdueDelay = 24 * time.Hour
)

const (
	// overdueBatch is the most rows claimed for looks at once.
	overdueBatch = 10
	// overdueChunk is the most index entries one statement of the scan
	// reads, and overdueChunks the most chunks a pass reads: a pass reads
	// at most 500,000 entries (a busy hour's traffic after a restart is
	// read in a few passes).
	overdueChunk  = 5000
	overdueChunks = 100
	// overdueSource names the sweep's lookups in the evidence: they are
	// the senders' (relay resolve's are "resolve").
	overdueSource = "sender"
)

// ReceiptSweepConfig configures a ReceiptSweep.
type ReceiptSweepConfig struct {
	// Pool is the database pool (the sender's); required.
	Pool *pgxpool.Pool
	// Provider is asked for the messages' fate; required unless Routes
	// are given. The sweep runs only where it can look messages up
	// (CanLookup).
	Provider Provider
	// Routes, when set, are the sender's providers by name: each row is
	// looked up at the provider it names, the first when it names none.
	Routes []Route
	// Receipts says whether the senders ask the provider for delivery
	// receipts (RECEIPTS_PUBLIC_URL is set). Without them every row would
	// be overdue, and the sweep does not run.
	Receipts bool
	// Overdue is how long after a row became sent without a receipt it is
	// looked up (SENDER_RECEIPT_OVERDUE); zero turns the sweep off. The
	// command's default is DefaultReceiptOverdue.
	Overdue time.Duration
	// Looks is how many times a row is looked up, the first Overdue after
	// it was sent, each next one twice as long after (at most
	// MaxReceiptOverdueDelay); a row the last look leaves sent stays sent
	// and leaves the sweep. Default DefaultReceiptOverdueLooks (5).
	Looks int
	// Rate is the most lookups a second this sweep makes; default
	// DefaultReceiptOverdueRate (1). Each also takes a token of Flow.
	Rate float64
	// Interval is the time between two passes; default
	// DefaultReceiptSweepInterval (30s).
	Interval time.Duration
	// Flow, when set, is the shared rate limit of provider requests: a
	// lookup is made only with a token that is there now (TryTake), so
	// that sends waiting for tokens keep them, and never during a pause.
	Flow Flow
	// DBTimeout bounds each database round trip; default
	// outbox.DefaultDBTimeout (10s).
	DBTimeout time.Duration
	// ShutdownTimeout bounds how long Run, once its context is done, keeps
	// trying to write what its last looks learned; default
	// DefaultShutdownTimeout (30s).
	ShutdownTimeout time.Duration
	// Logger receives the sweep's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the sweep's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// ReceiptSweep looks up the sent rows whose delivery receipt is overdue and
// moves each to the fate the provider reports (delivered or undelivered),
// forward only. A receipt lost with a failed-over primary, one the provider
// never sent, or one the receiver could not take before the provider gave
// up would otherwise leave the row sent for good.
//
// Each pass scans the final rows that became overdue since the last pass
// (outbox.MarkOverdue: a bounded range of the index on final rows, each
// read once) and marks the sent ones; then it claims the marked rows whose
// look is due (outbox.ClaimOverdue: taking the look schedules the next, so
// that no other sender's sweep takes the row meanwhile), looks each up at
// a bounded rate, and records what it learned (outbox.RecordOverdueLooks).
// A look that finds the message still accepted, finds nothing that is
// unambiguously the row's, or fails, settles nothing: the row is looked at
// again at twice the delay, up to Looks times.
type ReceiptSweep struct {
	cfg      ReceiptSweepConfig
	log      *slog.Logger
	schedule []time.Duration
	metrics  *overdueMetrics

	// mu serializes passes, which own the fields below it.
	mu sync.Mutex
	// from is where the next scan starts, by the database's clock (zero
	// before the first: the scan then reads back Overdue).
	from time.Time
	// nextLook is the earliest the next lookup may be made (Rate).
	nextLook time.Time
	// failures counts the passes that failed in a row (Run's logging).
	failures int
}

// NewReceiptSweep returns a ReceiptSweep, or an error naming the invalid
// setting.
func NewReceiptSweep(cfg ReceiptSweepConfig) (*ReceiptSweep, error) {
	cfg.Looks = cmp.Or(cfg.Looks, DefaultReceiptOverdueLooks)
	cfg.Rate = cmp.Or(cfg.Rate, DefaultReceiptOverdueRate)
	cfg.Interval = cmp.Or(cfg.Interval, DefaultReceiptSweepInterval)
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, outbox.DefaultDBTimeout)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Provider == nil && len(cfg.Routes) > 0 {
		cfg.Provider = cfg.Routes[0].Provider
	}
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("receipt sweep: Config.Pool is required")
	case cfg.Provider == nil:
		return nil, errors.New("receipt sweep: Config.Provider is required")
	case cfg.Overdue < 0:
		return nil, fmt.Errorf("receipt sweep: Overdue %s must not be negative", cfg.Overdue)
	case cfg.Looks < 1 || cfg.Looks > 100:
		return nil, fmt.Errorf("receipt sweep: Looks %d is outside 1..100", cfg.Looks)
	case !(cfg.Rate > 0):
		return nil, fmt.Errorf("receipt sweep: Rate %g must be positive", cfg.Rate)
	case cfg.Interval < 0 || cfg.DBTimeout < 0 || cfg.ShutdownTimeout < 0:
		return nil, errors.New("receipt sweep: Interval, DBTimeout and ShutdownTimeout must be positive")
	}
	m, err := newOverdueMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &ReceiptSweep{
		cfg: cfg, log: cfg.Logger.With("component", "receipt_sweep"), metrics: m,
		schedule: overdueSchedule(cfg.Overdue, cfg.Looks),
	}, nil
}

// Enabled reports whether the sweep runs: receipts are asked for, the
// provider can be looked up, and Overdue is set.
func (w *ReceiptSweep) Enabled() bool {
	return w.cfg.Overdue > 0 && w.cfg.Receipts && slices.ContainsFunc(w.providers(), Provider.CanLookup)
}

// providers returns every provider the sweep may ask.
func (w *ReceiptSweep) providers() []Provider {
	if len(w.cfg.Routes) == 0 {
		return []Provider{w.cfg.Provider}
	}
	ps := make([]Provider, len(w.cfg.Routes))
	for i, r := range w.cfg.Routes {
		ps[i] = r.Provider
	}
	return ps
}

// provider returns the provider a row names (the first when it names
// none), or nil when the sweep does not have it.
func (w *ReceiptSweep) provider(name string) Provider {
	if name == "" || len(w.cfg.Routes) == 0 {
		return w.cfg.Provider
	}
	for _, r := range w.cfg.Routes {
		if r.Name == name {
			return r.Provider
		}
	}
	return nil
}

// Run makes a pass every Interval until ctx is done, and returns nil once
// the pass in hand has written what it learned (within ShutdownTimeout). A
// sweep that is not Enabled returns at once.
func (w *ReceiptSweep) Run(ctx context.Context) error {
	if !w.Enabled() {
		return nil
	}
	w.log.Info("receipt sweep started", "overdue", w.cfg.Overdue.String(), "looks", w.cfg.Looks, "rate", w.cfg.Rate)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := w.Pass(ctx); err != nil && ctx.Err() == nil {
			w.failures++
			if retrying(w.failures) {
				w.log.Warn("receipt sweep pass failed; trying again next pass", "failures", w.failures, "err", err)
			}
		} else if err == nil {
			w.failures = 0
		}
		t.Reset(w.cfg.Interval)
	}
}

// Pass makes one pass, if the sweep is Enabled: it marks the rows that
// became overdue since the last pass, then looks up the marked rows whose
// look is due, as many as Rate allows in an Interval. What the looks
// learned is written before it returns, even once ctx is done (within
// ShutdownTimeout); rows claimed and not looked up are given back.
func (w *ReceiptSweep) Pass(ctx context.Context) error {
	if !w.Enabled() {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.scan(ctx); err != nil {
		return err
	}
	budget := max(1, int(w.cfg.Rate*w.cfg.Interval.Seconds()))
	for budget > 0 && ctx.Err() == nil {
		n, more, err := w.lookBatch(ctx, min(budget, overdueBatch))
		if err != nil {
			return err
		}
		budget -= n
		if !more {
			break
		}
	}
	return nil
}

// scan marks the rows that became overdue since the last scan, a chunk at
// a time, until it has caught up with now less Overdue (or read
// overdueChunks chunks: the next pass goes on from there). The first scan
// of a process reads back Overdue further: rows that became overdue while
// no sweep ran (every sender down) for up to that long are found.
func (w *ReceiptSweep) scan(ctx context.Context) error {
	withoutRef := slices.ContainsFunc(w.providers(), func(p Provider) bool { return !p.LookupByContent() })
	for range overdueChunks {
		dbCtx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
		s, err := outbox.MarkOverdue(dbCtx, w.cfg.Pool, w.from, w.cfg.Overdue, w.cfg.Overdue, overdueChunk, withoutRef)
		cancel()
		if err != nil {
			return err
		}
		if s.Marked > 0 {
			w.metrics.found.Add(float64(s.Marked))
			w.log.Info("receipts overdue; the rows will be looked up", "rows", s.Marked)
		}
		if s.Read < overdueChunk {
			w.from = s.Upto
			return nil
		}
		// A full chunk: the next starts at its last entry (read again,
		// with any others of the same time), and always moves on.
		next := s.Last
		if !next.After(w.from) {
			next = w.from.Add(time.Microsecond)
		}
		w.from = next
	}
	return nil
}

// lookBatch claims up to n rows whose look is due and looks them up; it
// returns how many it looked up, and whether more may be due.
func (w *ReceiptSweep) lookBatch(ctx context.Context, n int) (int, bool, error) {
	pace := time.Duration(float64(time.Second) / w.cfg.Rate)
	// No other sweep takes a claimed row while this one may still look it
	// up: the whole batch's paced lookups, and the write after.
	hold := time.Duration(n)*(pace+w.cfg.Provider.Timeout()) + 2*w.cfg.DBTimeout
	dbCtx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
	rows, err := outbox.ClaimOverdue(dbCtx, w.cfg.Pool, n, w.schedule, hold)
	cancel()
	if err != nil || len(rows) == 0 {
		return 0, false, err
	}
	var (
		looks    []outbox.OverdueLook
		unlooked []uuid.UUID
	)
	for i, r := range rows {
		if !w.wait(ctx, pace) {
			for _, r := range rows[i:] {
				unlooked = append(unlooked, r.ID)
			}
			break
		}
		l, ok := w.look(ctx, r)
		if !ok {
			unlooked = append(unlooked, r.ID)
			continue
		}
		looks = append(looks, l)
	}
	w.write(ctx, looks, unlooked)
	return len(looks), len(rows) == n && len(unlooked) == 0, nil
}

// wait paces the lookups at Rate and takes a token of the shared limit; it
// reports false when the lookup is not to be made now: ctx is done, or the
// shared limit has no token to spare (sends waiting for tokens get them
// first; the rows are looked up at a later pass).
func (w *ReceiptSweep) wait(ctx context.Context, pace time.Duration) bool {
	if d := time.Until(w.nextLook); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	if ctx.Err() != nil || (w.cfg.Flow != nil && !w.cfg.Flow.TryTake()) {
		return false
	}
	w.nextLook = time.Now().Add(pace)
	return true
}

// look asks the provider for row r's message; it reports false when the
// lookup was cut short by ctx (the row's look is given back).
func (w *ReceiptSweep) look(ctx context.Context, r outbox.OverdueRow) (outbox.OverdueLook, bool) {
	p := w.provider(r.Provider)
	var lr provider.LookupResult
	switch {
	case p == nil || !p.CanLookup():
		lr.Err = fmt.Errorf("the row's provider %q cannot be looked up by this sender", r.Provider)
	default:
		lr = p.Lookup(ctx, provider.LookupQuery{Reference: r.ID.String(), To: r.To, Body: r.Body, Since: r.CreatedAt})
	}
	if lr.Err != nil && ctx.Err() != nil {
		return outbox.OverdueLook{}, false
	}
	own, result, detail := ownMessage(lr, r.ProviderRef, p != nil && p.LookupByContent())
	l := outbox.OverdueLook{
		ID: r.ID, Last: r.Look >= w.cfg.Looks,
		Lookup: outbox.Evidence{Kind: "lookup", Result: result, ProviderRef: own.Ref, ReceivedAt: time.Now(), Source: overdueSource,
			Detail: fmt.Sprintf("receipt overdue, look %d of %d: %s", r.Look, w.cfg.Looks, detail)},
	}
	class := "unmatched"
	switch {
	case lr.Err != nil:
		class = "failed"
	case result == "found" && (own.Status == string(outbox.StatusDelivered) || own.Status == string(outbox.StatusUndelivered)):
		l.Fate, l.ProviderRef, l.Last = outbox.State(own.Status), own.Ref, false
		class = own.Status
	case result == "found":
		class = "accepted"
	}
	w.metrics.lookups.WithLabelValues(class).Inc()
	if w.log.Enabled(ctx, slog.LevelDebug) {
		w.log.Debug("receipt overdue: provider lookup", "outbox_id", r.ID.String(), "look", r.Look, "result", class,
			"latency", lr.Latency.String(), "err", lr.Err)
	}
	return l, true
}

// write records the looks and gives back the rows not looked up, trying
// again through a database outage until ShutdownTimeout after ctx is done:
// what a lookup learned is not dropped for an outage.
func (w *ReceiptSweep) write(ctx context.Context, looks []outbox.OverdueLook, unlooked []uuid.UUID) {
	if len(looks) == 0 && len(unlooked) == 0 {
		return
	}
	var giveUpAt time.Time // set once ctx is done
	for failures := 1; ; failures++ {
		dbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.DBTimeout)
		var written outbox.OverdueWritten
		err := pgx.BeginFunc(dbCtx, w.cfg.Pool, func(tx pgx.Tx) error {
			var err error
			if written, err = outbox.RecordOverdueLooks(dbCtx, tx, looks); err != nil {
				return err
			}
			return outbox.ReleaseOverdue(dbCtx, tx, unlooked)
		})
		cancel()
		if err == nil {
			w.wrote(looks, written)
			return
		}
		if retrying(failures) {
			w.log.Warn("receipt sweep: writing the looks failed; trying again", "looks", len(looks), "failures", failures, "err", err)
		}
		if ctx.Err() != nil && giveUpAt.IsZero() {
			giveUpAt = time.Now().Add(w.cfg.ShutdownTimeout)
		}
		if !giveUpAt.IsZero() && time.Now().After(giveUpAt) {
			w.log.Warn("receipt sweep: looks not written within the shutdown timeout; the rows will be looked up again", "looks", len(looks))
			return
		}
		time.Sleep(time.Second)
	}
}

// wrote counts and logs what a write did.
func (w *ReceiptSweep) wrote(looks []outbox.OverdueLook, written outbox.OverdueWritten) {
	for _, l := range looks {
		if l.Fate != "" && slices.Contains(written.Settled, l.ID) {
			w.log.Info("receipt overdue: settled by lookup", "outbox_id", l.ID.String(), "status", string(l.Fate))
		}
	}
	w.metrics.settled.Add(float64(len(written.Settled)))
	for _, id := range written.GaveUp {
		w.log.Info("receipt overdue: looks exhausted; the row stays sent", "outbox_id", id.String(), "looks", w.cfg.Looks)
	}
	w.metrics.gaveUp.Add(float64(len(written.GaveUp)))
}

// overdueSchedule is the delay after each look at a row with an overdue
// receipt: the first look is overdue after the row was sent, each next one
// as long after the previous as the row was old then (the delays double
// from overdue), at most MaxReceiptOverdueDelay apart. Element n-1 is the
// delay after look n.
func overdueSchedule(overdue time.Duration, looks int) []time.Duration {
	out := make([]time.Duration, max(looks, 1))
	d := max(overdue, time.Second)
	for i := range out {
		out[i] = min(d, MaxReceiptOverdueDelay)
		if d < MaxReceiptOverdueDelay {
			d *= 2
		}
	}
	return out
}

// ownMessage tells which message a lookup found for a sent row is the
// row's own, and the evidence's result and text. Only an unambiguous
// answer names one: the message with the row's provider id when the row
// has one (at Twilio, found by content, that id is the only tie to the
// row: another row's message may have the same text); without an id, the
// only message a lookup by reference found. Anything else settles nothing.
func ownMessage(lr provider.LookupResult, ref string, byContent bool) (own provider.Found, result, detail string) {
	switch {
	case lr.Err != nil:
		return provider.Found{}, "failed", "lookup failed: " + lr.Err.Error()
	case ref != "":
		if i := slices.IndexFunc(lr.Found, func(f provider.Found) bool { return f.Ref == ref }); i >= 0 {
			own = lr.Found[i]
			return own, "found", fmt.Sprintf("lookup: the provider has the message (%s)", own.Status)
		}
		if byContent || len(lr.Found) == 0 {
			return provider.Found{}, "none", fmt.Sprintf("lookup: none of the %d messages found has the row's provider id", len(lr.Found))
		}
		return provider.Found{}, "several", fmt.Sprintf("lookup: the provider has %d messages for this reference, none with the row's provider id", len(lr.Found))
	case byContent:
		return provider.Found{}, "none", "lookup: the row has no provider id, and a message found by its text may be another row's"
	case len(lr.Found) == 1:
		own = lr.Found[0]
		return own, "found", fmt.Sprintf("lookup: the provider has the message (%s)", own.Status)
	case len(lr.Found) == 0:
		return provider.Found{}, "none", "lookup: the provider has no message for this reference"
	}
	return provider.Found{}, "several", fmt.Sprintf("lookup: the provider has %d messages for this reference", len(lr.Found))
}

type overdueMetrics struct {
	found, settled, gaveUp prometheus.Counter
	lookups                *prometheus.CounterVec
}

func newOverdueMetrics(reg prometheus.Registerer) (*overdueMetrics, error) {
	m := &overdueMetrics{
		found: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_receipts_overdue_total",
			Help: "Sent rows found without a delivery receipt past SENDER_RECEIPT_OVERDUE, and marked to be looked up.",
		}),
		settled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_receipts_overdue_settled_total",
			Help: "Rows with an overdue receipt moved to delivered or undelivered by a lookup.",
		}),
		gaveUp: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_sender_receipts_overdue_given_up_total",
			Help: "Rows with an overdue receipt whose looks ran out (SENDER_RECEIPT_OVERDUE_LOOKS) while still sent.",
		}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_receipt_lookups_total",
			Help: "Lookups of rows with an overdue receipt, by result: delivered, undelivered (settled), accepted (the provider has no fate yet), unmatched (nothing found is unambiguously the row's), failed.",
		}, []string{"result"}),
	}
	for _, r := range []string{"delivered", "undelivered", "accepted", "unmatched", "failed"} {
		m.lookups.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.found, m.settled, m.gaveUp, m.lookups} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("receipt sweep: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
