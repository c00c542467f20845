package sender_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// overdueTime is the sweeps' overdue time in these tests; rows are made
// overdue by dating their send back.
const overdueTime = time.Minute

// sweepEnv is a migrated database (the sweep runs as sendonce_sender), the
// stub over real HTTP (behind wrap, when a test wants a hand in its
// answers) and a provider client with lookups, asking for receipts at an
// address where nothing listens: no receipt ever comes.
type sweepEnv struct {
	admin, pool *pgxpool.Pool
	stub        *smsstub.Server
	client      *provider.Client
}

func newSweepEnv(t *testing.T, cfg smsstub.Config, wrap func(http.Handler) http.Handler) *sweepEnv {
	t.Helper()
	admin, dsn := pgtest.NewPool(t)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, dsn, "sendonce_sender"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	stub, err := smsstub.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := stub.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(func() { _ = stub.Close() })
	t.Cleanup(ts.Close)
	var c *provider.Client
	if cfg.Twilio.AccountSID != "" {
		c, err = provider.NewTwilio(provider.TwilioConfig{BaseURL: ts.URL, AccountSID: cfg.Twilio.AccountSID,
			AuthToken: cfg.Twilio.AuthToken, From: "+15550001111", Lookup: true, Timeout: 5 * time.Second,
			ReceiptsURL: "http://127.0.0.1:1"})
	} else {
		c, err = provider.New(provider.Config{BaseURL: ts.URL, Timeout: 5 * time.Second, Lookup: true,
			ReceiptsURL: "http://127.0.0.1:1"})
	}
	if err != nil {
		t.Fatal(err)
	}
	return &sweepEnv{admin: admin, pool: pool, stub: stub, client: c}
}

// sent sends a message to the stub for a new row and records the row sent
// age ago, with the provider's id when withRef; it returns the row's id.
func (e *sweepEnv) sent(t *testing.T, to, body string, age time.Duration, withRef bool) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	id := uuid.New()
	if _, err := e.admin.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count) VALUES ($1, $2, $3, 'sending', 1)`,
		id, to, body); err != nil {
		t.Fatal(err)
	}
	o := e.client.Send(ctx, provider.Message{Key: id.String(), To: to, Body: body})
	if o.Kind != provider.Sent {
		t.Fatalf("send: %+v", o)
	}
	var ref *string
	if withRef {
		ref = &o.Ref
	}
	if _, err := e.admin.Exec(ctx, `UPDATE sms_outbox SET status = 'sent', provider_ref = $2,
		sent_at = now() - $3::interval, updated_at = now() - $3::interval WHERE id = $1`, id, ref, age); err != nil {
		t.Fatal(err)
	}
	return id
}

// row is what the tests read of a row.
type row struct {
	status, ref    string
	pending        bool
	looks          int
	nextIn         time.Duration
	lookupEvidence []string // the results of its recorded lookups, oldest first
}

func (e *sweepEnv) row(t *testing.T, id uuid.UUID) row {
	t.Helper()
	var r row
	var next time.Time
	var now time.Time
	err := e.admin.QueryRow(context.Background(), `SELECT status, coalesce(provider_ref, ''), lookup_pending, lookups, next_attempt_at, now(),
			coalesce((SELECT array_agg(result ORDER BY id) FROM sms_evidence WHERE outbox_id = $1 AND kind = 'lookup'), '{}')
		FROM sms_outbox WHERE id = $1`, id).Scan(&r.status, &r.ref, &r.pending, &r.looks, &next, &now, &r.lookupEvidence)
	if err != nil {
		t.Fatal(err)
	}
	r.nextIn = next.Sub(now)
	return r
}

func (e *sweepEnv) sweep(t *testing.T, cfg sender.ReceiptSweepConfig) (*sender.ReceiptSweep, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Pool, cfg.Registerer = e.pool, reg
	if cfg.Provider == nil {
		cfg.Provider = e.client
	}
	if cfg.Rate == 0 {
		cfg.Rate = 1000
	}
	cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := sender.NewReceiptSweep(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w, reg
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func pass(t *testing.T, w *sender.ReceiptSweep) {
	t.Helper()
	if err := w.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A sent row whose receipt never came (the stub sends none here) is looked
// up once its receipt is overdue and moved to the fate the provider
// reports, with the lookup recorded as evidence; rows that are not overdue,
// or were settled by their receipt, are not looked up.
func TestReceiptSweepSettlesRowsWhoseReceiptNeverCame(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Millisecond, UndeliveredSuffixes: []string{"99"}}}, nil)
	delivered := e.sent(t, "+15550000001", "Your code is 1", 90*time.Second, true)
	undelivered := e.sent(t, "+15550000099", "Your code is 2", 90*time.Second, true)
	// A row whose id the provider's answer did not give: the only message
	// for its reference is its own.
	noRef := e.sent(t, "+15550000003", "Your code is 3", 90*time.Second, false)
	recent := e.sent(t, "+15550000004", "Your code is 4", 10*time.Second, true)
	receipted := e.sent(t, "+15550000005", "Your code is 5", 90*time.Second, true)
	if _, err := e.admin.Exec(context.Background(), `UPDATE sms_outbox SET status = 'delivered' WHERE id = $1`, receipted); err != nil {
		t.Fatal(err)
	}
	w, reg := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	pass(t, w)

	for id, want := range map[uuid.UUID]string{delivered: "delivered", undelivered: "undelivered", noRef: "delivered"} {
		r := e.row(t, id)
		if r.status != want || r.pending || r.ref == "" || len(r.lookupEvidence) != 1 || r.lookupEvidence[0] != "found" {
			t.Errorf("row %s: %+v, want %s with its provider id and one lookup found", id, r, want)
		}
	}
	for _, id := range []uuid.UUID{recent, receipted} {
		if r := e.row(t, id); r.pending || len(r.lookupEvidence) != 0 {
			t.Errorf("row %s (not overdue, or receipted) was marked or looked up: %+v", id, r)
		}
	}
	if n := e.stub.Stats().Lookups; n != 3 {
		t.Errorf("%d lookups at the provider, want 3", n)
	}
	if got := metric(t, reg, "sendonce_sender_receipts_overdue_settled_total"); got != 3 {
		t.Errorf("settled counter %v, want 3", got)
	}
	if got := metric(t, reg, "sendonce_sender_receipts_overdue_total"); got != 3 {
		t.Errorf("overdue counter %v, want 3", got)
	}
}

// metric returns the value of the counter name (without labels) in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A row that a receipt moves on while its lookup is under way keeps what
// the receipt said: the lookup (which says otherwise) is recorded, and the
// row is not touched. A row settled before its look is not looked up.
func TestReceiptSweepLeavesARowThatMovedOn(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		onLookup func()
	)
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.URL.Path == "/v1/messages" {
				mu.Lock()
				f := onLookup
				mu.Unlock()
				if f != nil {
					f()
				}
			}
			h.ServeHTTP(w, r)
		})
	}
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Millisecond}}, wrap)
	racing := e.sent(t, "+15550000011", "Your code is 11", 90*time.Second, true)
	before := e.sent(t, "+15550000012", "Your code is 12", 90*time.Second, true)
	ctx := context.Background()
	receipt := func(id uuid.UUID) {
		err := pgx.BeginFunc(ctx, e.admin, func(tx pgx.Tx) error {
			_, err := outbox.ApplyReceipts(ctx, tx, []outbox.Receipt{{ID: id, Status: outbox.StatusUndelivered, Code: 30003, Source: "generic"}})
			return err
		})
		if err != nil {
			t.Error(err)
		}
	}
	w, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	// One row's receipt comes before the pass; the other's while the
	// provider is being asked about it.
	receipt(before)
	mu.Lock()
	onLookup = func() { receipt(racing) }
	mu.Unlock()
	pass(t, w)

	r := e.row(t, racing)
	if r.status != "undelivered" || r.pending || len(r.lookupEvidence) != 1 {
		t.Errorf("the row a receipt settled during its lookup: %+v; want undelivered as the receipt said, the lookup recorded", r)
	}
	if r := e.row(t, before); r.status != "undelivered" || len(r.lookupEvidence) != 0 {
		t.Errorf("the row a receipt settled before its look: %+v; want undelivered and not looked up", r)
	}
	if n := e.stub.Stats().Lookups; n != 1 {
		t.Errorf("%d lookups, want 1", n)
	}
}

// Two senders' sweeps at once over the same overdue rows look each row up
// once: a claim takes the look and moves the next one past the time the
// batch takes, so the other sweep skips the row.
func TestTwoReceiptSweepsDoNotLookUpTheSameRow(t *testing.T) {
	t.Parallel()
	// Each lookup takes a while, so the sweeps' batches overlap.
	slow := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				time.Sleep(20 * time.Millisecond)
			}
			h.ServeHTTP(w, r)
		})
	}
	// The fate stays unknown: every look settles nothing.
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Hour}}, slow)
	const n = 40
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = e.sent(t, "+1555000010"+string(rune('0'+i%10)), "Your code is "+uuid.NewString()[:6], 90*time.Second, true)
	}
	a, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	b, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	var wg sync.WaitGroup
	for _, w := range []*sender.ReceiptSweep{a, b, a, b} {
		wg.Go(func() { pass(t, w) })
	}
	wg.Wait()
	if got := e.stub.Stats().Lookups; got != n {
		t.Errorf("%d lookups of %d rows, want one each", got, n)
	}
	for _, id := range ids {
		if r := e.row(t, id); len(r.lookupEvidence) != 1 || r.looks != 1 {
			t.Errorf("row %s: %d lookups recorded, %d looks counted; want 1", id, len(r.lookupEvidence), r.looks)
		}
	}
}

// A row whose lookup keeps saying the message is accepted is looked at
// again later, not at every pass: the delay after each look doubles, and
// after the last look the row stays sent and leaves the sweep.
func TestReceiptSweepLooksAgainLaterNotEveryPass(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Hour}}, nil)
	id := e.sent(t, "+15550000021", "Your code is 21", 90*time.Second, true)
	w, reg := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime, Looks: 2})
	for range 5 {
		pass(t, w)
	}
	r := e.row(t, id)
	if e.stub.Stats().Lookups != 1 || r.looks != 1 || !r.pending || r.status != "sent" {
		t.Fatalf("after 5 passes: %d lookups, row %+v; want one look, the row still sent and marked", e.stub.Stats().Lookups, r)
	}
	if r.nextIn < overdueTime-5*time.Second {
		t.Fatalf("the next look is due in %s, want at least the overdue time %s", r.nextIn, overdueTime)
	}
	// Time passes: the next look is due.
	if _, err := e.admin.Exec(context.Background(), `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		pass(t, w)
	}
	r = e.row(t, id)
	if e.stub.Stats().Lookups != 2 || r.looks != 2 || r.pending || r.status != "sent" {
		t.Fatalf("after the second (last) look: %d lookups, row %+v; want the row sent and no longer marked", e.stub.Stats().Lookups, r)
	}
	if want := []string{"found", "found"}; strings.Join(r.lookupEvidence, ",") != strings.Join(want, ",") {
		t.Fatalf("lookups recorded %v, want %v", r.lookupEvidence, want)
	}
	if got := metric(t, reg, "sendonce_sender_receipts_overdue_given_up_total"); got != 1 {
		t.Fatalf("given-up counter %v, want 1", got)
	}
}

// A failed lookup settles nothing and is tried again later, like one that
// finds the message still accepted.
func TestReceiptSweepTriesAFailedLookupLater(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Millisecond},
		Faults: smsstub.Faults{LookupFailRate: 1}}, nil)
	id := e.sent(t, "+15550000031", "Your code is 31", 90*time.Second, true)
	w, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	pass(t, w)
	pass(t, w)
	r := e.row(t, id)
	if r.status != "sent" || !r.pending || r.looks != 1 || strings.Join(r.lookupEvidence, ",") != "failed" || r.nextIn < overdueTime-5*time.Second {
		t.Fatalf("after a failed lookup: %+v; want the row sent, marked, looked at once and due again later", r)
	}
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.Exec(context.Background(), `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	pass(t, w)
	if r := e.row(t, id); r.status != "delivered" || r.pending {
		t.Fatalf("after the provider came back: %+v; want delivered", r)
	}
}

// The sweep's lookups take only the shared limit's spare tokens: while the
// senders are paused (a provider's 429), or sends hold every token, it
// looks nothing up, and gives the looks it claimed back (due again, not
// spent); with tokens to spare it settles the rows.
func TestReceiptSweepLeavesTheRateLimitToSends(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Millisecond}}, nil)
	ids := []uuid.UUID{
		e.sent(t, "+15550000071", "Your code is 71", 90*time.Second, true),
		e.sent(t, "+15550000072", "Your code is 72", 90*time.Second, true),
	}
	_, js := natstest.Start(t).Connect(t)
	lim, err := flow.New(flow.Config{JetStream: js, Create: true, ID: "sweep-test"})
	if err != nil {
		t.Fatal(err)
	}
	lim.Pause(context.Background(), time.Minute)
	w, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime, Flow: lim})
	pass(t, w)
	if n := e.stub.Stats().Lookups; n != 0 {
		t.Fatalf("%d lookups while the senders are paused", n)
	}
	for _, id := range ids {
		if r := e.row(t, id); r.status != "sent" || !r.pending || r.looks != 0 || r.nextIn > 0 {
			t.Fatalf("a row claimed and not looked up: %+v; want its look given back, due now", r)
		}
	}
	w, _ = e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	pass(t, w)
	for _, id := range ids {
		if r := e.row(t, id); r.status != "delivered" {
			t.Fatalf("with tokens to spare: %+v; want delivered", r)
		}
	}
}

// At Twilio, found by its number and text, a message is a row's only by
// its sid: a row with its sid is settled by it, whatever else has the same
// text, and one whose sid is not among the messages found is not; a row
// without a sid is not looked up (its twin's message would do as well as
// its own).
func TestReceiptSweepAtTwilioGoesBySid(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, smsstub.Config{IgnoreKeys: true,
		Twilio:   smsstub.Twilio{AccountSID: "AC1", AuthToken: "tok", QueueFor: time.Millisecond},
		Receipts: smsstub.Receipts{Delay: time.Millisecond, UndeliveredSuffixes: []string{"+15550000042"}}}, nil)
	const text = "Your table is ready."
	withSid := e.sent(t, "+15550000041", text, 90*time.Second, true)
	twin := e.sent(t, "+15550000041", text, 90*time.Second, false)
	other := e.sent(t, "+15550000042", text, 90*time.Second, true)
	// A row whose sid is none of the messages with its text: they are
	// other rows', and settle nothing.
	strange := e.sent(t, "+15550000041", text, 90*time.Second, true)
	if _, err := e.admin.Exec(context.Background(), `UPDATE sms_outbox SET provider_ref = 'SM00000000000000000000000000000000' WHERE id = $1`, strange); err != nil {
		t.Fatal(err)
	}
	w, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	pass(t, w)
	if r := e.row(t, strange); r.status != "sent" || !r.pending || strings.Join(r.lookupEvidence, ",") != "none" {
		t.Errorf("the row whose sid Twilio does not list: %+v, want sent, still marked, its lookup none", r)
	}
	if r := e.row(t, withSid); r.status != "delivered" || r.pending || strings.Join(r.lookupEvidence, ",") != "found" {
		t.Errorf("the row with its sid: %+v, want delivered by its own message", r)
	}
	if r := e.row(t, other); r.status != "undelivered" {
		t.Errorf("the row to another number: %+v, want undelivered", r)
	}
	if r := e.row(t, twin); r.status != "sent" || r.pending || len(r.lookupEvidence) != 0 {
		t.Errorf("the row without a sid: %+v, want sent, not marked, not looked up", r)
	}
}

// Without receipts asked for, without lookups, or with the overdue time at
// zero, the sweep does nothing: no row is marked or looked up.
func TestReceiptSweepIsOffWithoutReceiptsOrLookups(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Millisecond}}, nil)
	id := e.sent(t, "+15550000051", "Your code is 51", 90*time.Second, true)
	noLookup, err := provider.New(provider.Config{BaseURL: "http://127.0.0.1:1", Timeout: time.Second, ReceiptsURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]sender.ReceiptSweepConfig{
		"no receipts":  {Receipts: false, Overdue: overdueTime},
		"no lookups":   {Receipts: true, Overdue: overdueTime, Provider: noLookup},
		"overdue zero": {Receipts: true, Overdue: 0},
	} {
		w, _ := e.sweep(t, cfg)
		if w.Enabled() {
			t.Errorf("%s: enabled", name)
		}
		pass(t, w)
		// Run returns at once, long before its context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := w.Run(ctx); err != nil || ctx.Err() != nil {
			t.Errorf("%s: Run returned %v once its context was %v, want nil at once", name, err, ctx.Err())
		}
		cancel()
	}
	if r := e.row(t, id); r.status != "sent" || r.pending || len(r.lookupEvidence) != 0 || e.stub.Stats().Lookups != 0 {
		t.Fatalf("a disabled sweep touched the row: %+v, %d lookups", r, e.stub.Stats().Lookups)
	}
	// The same row and sweep with receipts and lookups on settle it.
	w, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime})
	pass(t, w)
	if r := e.row(t, id); r.status != "delivered" {
		t.Fatalf("an enabled sweep left the row %+v", r)
	}
}

// Run sweeps every Interval until its context is done, then returns nil.
func TestReceiptSweepRun(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Millisecond}}, nil)
	// A row that becomes overdue half a second after the sweep's first
	// pass: a later pass finds it.
	id := e.sent(t, "+15550000061", "Your code is 61", overdueTime-500*time.Millisecond, true)
	w, _ := e.sweep(t, sender.ReceiptSweepConfig{Receipts: true, Overdue: overdueTime, Interval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	testkit.WaitFor(t, 30*time.Second, "the row settled by a pass", func() bool { return e.row(t, id).status == "delivered" })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
