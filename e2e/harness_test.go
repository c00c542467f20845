// Package e2e runs the whole pipeline on real parts: a Postgres database of
// its own, an embedded NATS server with the production stream configs, the
// provider stub over real HTTP, and in-process toxiproxy for network faults.
package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/toxictest"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

const testAPIKey = "test-api-key-3f9a1c"

type env struct {
	t       *testing.T
	pool    *pgxpool.Pool
	url     string // the database's URL
	nats    *natstest.Server
	js      jetstream.JetStream
	stub    *smsstub.Server
	stubURL string
	logs    *logSink
}

type envOptions struct {
	stub smsstub.Config
}

func setup(t *testing.T, opts envOptions) *env {
	t.Helper()
	pool, url := pgtest.NewPool(t)
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	cfg := opts.stub
	cfg.APIKey = testAPIKey
	stub, err := smsstub.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		_ = stub.Close()
	})
	return &env{t: t, pool: pool, url: url, nats: srv, js: js, stub: stub, stubURL: hs.URL, logs: &logSink{t: t}}
}

// logSink passes every log line to t.Log and keeps it for the scans that
// check nothing secret is logged.
type logSink struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.lines = append(s.lines, string(p))
	s.mu.Unlock()
	s.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (s *logSink) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "")
}

func (e *env) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// background runs fn(ctx) until the test ends or the returned stop is called.
func (e *env) background(name string, fn func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("%s: %v", name, err)
				}
			case <-time.After(60 * time.Second):
				e.t.Errorf("%s did not stop within 60s", name)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *env) startRelay(cfg relay.Config) (*relay.Relay, func()) {
	e.t.Helper()
	_, js := e.nats.Connect(e.t)
	cfg.Pool, cfg.JetStream, cfg.Logger = e.pool, js, e.logger()
	cfg.PollInterval = max(cfg.PollInterval, 100*time.Millisecond)
	r, err := relay.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return r, e.background("relay", r.Run)
}

type senderOptions struct {
	baseURL    string // default: the stub
	timeout    time.Duration
	idempotent *bool
	cfg        sender.Config
	// flow, when set, gives the sender a shared flow limiter with this
	// rate limit (0: no limit, but the provider's pauses are shared).
	flow *float64
	// lookup turns lookups on; receipts is the receiver's URL, asked for
	// receipts.
	lookup   bool
	receipts string
	// twilio sends through the Twilio adapter, to the stub's Twilio facade
	// (the env's stub needs smsstub.Config.Twilio with testTwilio).
	twilio bool
	// pool, when set, is the sender's database pool (a role's); default
	// the env's, as the table's owner.
	pool *pgxpool.Pool
}

// testTwilio is the stub's Twilio account for the Twilio adapter's tests.
var testTwilio = smsstub.Twilio{AccountSID: "ACe2e0000000000000000000000000000", AuthToken: "e2e-twilio-auth-token"}

func (e *env) startSender(o senderOptions) func() {
	e.t.Helper()
	idem := true
	if o.idempotent != nil {
		idem = *o.idempotent
	}
	var prov *provider.Client
	var err error
	if o.twilio {
		prov, err = provider.NewTwilio(provider.TwilioConfig{
			BaseURL: cmpOr(o.baseURL, e.stubURL), AccountSID: testTwilio.AccountSID, AuthToken: testTwilio.AuthToken,
			From: "+15550001111", Timeout: cmpOr(o.timeout, 5*time.Second), Lookup: o.lookup, ReceiptsURL: o.receipts,
		})
	} else {
		prov, err = provider.New(provider.Config{
			BaseURL: cmpOr(o.baseURL, e.stubURL), APIKey: testAPIKey,
			Timeout: cmpOr(o.timeout, 5*time.Second), Idempotent: idem, Lookup: o.lookup, ReceiptsURL: o.receipts,
		})
	}
	if err != nil {
		e.t.Fatal(err)
	}
	// Each sender has its own connection, as separate processes would.
	_, js := e.nats.Connect(e.t)
	cfg := o.cfg
	cfg.Pool, cfg.JetStream, cfg.Logger = e.pool, js, e.logger()
	if o.pool != nil {
		cfg.Pool = o.pool
	}
	if cfg.Provider == nil {
		cfg.Provider = prov
	}
	cfg.RetryBase = cmpOr(cfg.RetryBase, 20*time.Millisecond)
	cfg.RetryCap = cmpOr(cfg.RetryCap, 200*time.Millisecond)
	var s *sender.Sender
	var lim *flow.Limiter
	if o.flow != nil {
		lim, err = flow.New(flow.Config{
			JetStream: js, Create: true, Limit: *o.flow, ID: "sender_" + uuid.NewString()[:8],
			Heartbeat: 100 * time.Millisecond, LiveFor: time.Second, Demand: func() int { return s.Waiting() },
			Logger: e.logger(),
		})
		if err != nil {
			e.t.Fatal(err)
		}
		cfg.Flow = lim
	}
	s, err = sender.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	stopFlow := func() {}
	if lim != nil {
		stopFlow = e.background("flow", lim.Run)
	}
	stopSender := e.background("sender", s.Run)
	return func() {
		stopSender()
		stopFlow()
	}
}

func cmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

// insert commits n rows through outbox.Enqueue, 100 per transaction.
func (e *env) insert(n int) []uuid.UUID {
	e.t.Helper()
	ids := make([]uuid.UUID, 0, n)
	ctx := context.Background()
	for len(ids) < n {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for i := 0; i < 100 && len(ids) < n; i++ {
				id, err := outbox.Enqueue(ctx, tx, testPhone(len(ids)), testBody(len(ids)))
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	return ids
}

// setBudget sets the rows' max_attempts. Tests about how a fault ends, not
// about the budget, raise it: with the tests' short retry cap a row spends
// the default 8 attempts in about a second, less than a loaded machine can
// take to notice and lift the fault.
func (e *env) setBudget(ids []uuid.UUID, n int) {
	e.t.Helper()
	// One row per statement: the pipeline is running, and a statement that
	// held one row while waiting for another could deadlock with a claim or
	// a status write holding them the other way round.
	for _, id := range ids {
		if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET max_attempts = $2 WHERE id = $1`, id, n); err != nil {
			e.t.Fatal(err)
		}
	}
}

func testPhone(i int) string { return fmt.Sprintf("+1555%07d", i) }
func testBody(i int) string  { return fmt.Sprintf("Your code is %06d", 100000+i) }

type row struct {
	id       uuid.UUID
	status   outbox.State
	attempts int
	ref      string
	lastErr  string
}

func (e *env) rows() map[uuid.UUID]row {
	e.t.Helper()
	rs, _ := e.pool.Query(context.Background(),
		`SELECT id, status, attempt_count, coalesce(provider_ref, ''), coalesce(last_error, '') FROM sms_outbox`)
	list, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.status, &x.attempts, &x.ref, &x.lastErr)
		return x, err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(map[uuid.UUID]row, len(list))
	for _, x := range list {
		out[x.id] = x
	}
	return out
}

func (e *env) row(id uuid.UUID) row {
	e.t.Helper()
	return e.rows()[id]
}

// waitTerminal waits until every one of ids has a terminal status.
func (e *env) waitTerminal(ids []uuid.UUID, d time.Duration) map[uuid.UUID]row {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		rows := e.rows()
		open := 0
		for _, id := range ids {
			if !rows[id].status.Terminal() {
				open++
			}
		}
		if open == 0 {
			return rows
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d of %d rows not terminal after %s", open, len(ids), d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAllSent waits up to d for ids to finish, fails the test unless every
// one ended sent, and checks each was sent exactly once.
func (e *env) waitAllSent(ids []uuid.UUID, d time.Duration) {
	e.t.Helper()
	rows := e.waitTerminal(ids, d)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			e.t.Fatalf("row %s ended %s (%s), want sent", id, rows[id].status, rows[id].lastErr)
		}
	}
	e.checkOnce(ids, rows)
}

// checkOnce asserts I1 for ids: a sent row was delivered exactly once, under
// its own id as the key, and its provider_ref is the stub's id; no other row
// was delivered more than once; and a dead row was not delivered at all
// ("dead" tells the application the user got nothing).
func (e *env) checkOnce(ids []uuid.UUID, rows map[uuid.UUID]row) {
	e.t.Helper()
	deliveries := e.stub.Deliveries()
	for _, id := range ids {
		r := rows[id]
		d := deliveries[id.String()]
		switch {
		case accepted(r.status) && d.Deliveries != 1:
			e.t.Errorf("row %s is %s with %d deliveries at the provider, want 1", id, r.status, d.Deliveries)
		case accepted(r.status) && r.ref != d.ProviderID:
			e.t.Errorf("row %s: provider_ref %q, stub id %q", id, r.ref, d.ProviderID)
		case r.status == outbox.StatusDead && d.Deliveries != 0:
			e.t.Errorf("row %s is dead but the provider delivered it %d times", id, d.Deliveries)
		case d.Deliveries > 1:
			e.t.Errorf("row %s (%s) was delivered %d times", id, r.status, d.Deliveries)
		}
	}
	// Every key the provider saw is a row id: keys are never minted per attempt.
	for key := range deliveries {
		id, err := uuid.Parse(key)
		if err != nil {
			e.t.Errorf("provider saw key %q, not a row id", key)
			continue
		}
		if _, ok := rows[id]; !ok {
			e.t.Errorf("provider saw key %s, which is no row", key)
		}
	}
}

// accepted reports whether status says the provider took the message.
func accepted(status outbox.State) bool {
	return status == outbox.StatusSent || status == outbox.StatusDelivered || status == outbox.StatusUndelivered
}

// testReceiptSecret signs the stub's receipts for the receiver.
var testReceiptSecret = []byte("e2e-receipt-secret-0123456789abcdef")

// startReceiver runs a receiver, acting as the least-privilege
// sendonce_receiver role, on a real socket, and returns its base URL.
func (e *env) startReceiver() string {
	e.t.Helper()
	pool := newPool(e.t, pgtest.AsRole(e.t, e.url, "sendonce_receiver"))
	rv, err := receiver.New(receiver.Config{Pool: pool, Secrets: [][]byte{testReceiptSecret}, Logger: e.logger()})
	if err != nil {
		e.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	// The shutdown bound outlasts the write deadline (10s), as the
	// command's does (30s): a receipt in flight when the test ends may
	// wait that long for its write, and is answered by then.
	e.background("receiver", func(ctx context.Context) error { return rv.Serve(ctx, ln, 15*time.Second) })
	return "http://" + ln.Addr().String()
}

// checkLogs asserts I5 on everything the components logged.
func (e *env) checkLogs(ids []uuid.UUID) {
	e.t.Helper()
	logs := e.logs.all()
	if strings.Contains(logs, testAPIKey) {
		e.t.Error("the API key appears in the logs")
	}
	for i := range ids {
		if strings.Contains(logs, testPhone(i)) {
			e.t.Fatalf("phone number %d appears in the logs", i)
		}
		if strings.Contains(logs, testBody(i)) {
			e.t.Fatalf("body %d appears in the logs", i)
		}
	}
}

// deadLetters returns the dead letters in SMS_DLQ.
func (e *env) deadLetters() []jetstream.RawStreamMsg {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, streams.DeadLetterStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, *m)
	}
	return out
}

// lettersOf waits until every row in ids has a dead letter, and returns the
// stream's letters. A sender stores a letter after the row's final status
// commits, so a terminal row's letter may be a moment behind it.
func (e *env) lettersOf(ids []uuid.UUID, timeout time.Duration) []jetstream.RawStreamMsg {
	e.t.Helper()
	var dls []jetstream.RawStreamMsg
	testkit.WaitFor(e.t, timeout, "a dead letter for every row", func() bool {
		dls = e.deadLetters()
		for _, id := range ids {
			if len(deadLetterFor(dls, id)) == 0 {
				return false
			}
		}
		return true
	})
	return dls
}

func deadLetterFor(dls []jetstream.RawStreamMsg, id uuid.UUID) []jetstream.RawStreamMsg {
	var out []jetstream.RawStreamMsg
	for _, m := range dls {
		if m.Header.Get(wire.HeaderOutboxID) == id.String() {
			out = append(out, m)
		}
	}
	return out
}

// newProxy puts toxiproxy between the senders and the stub.
func (e *env) newProxy() *toxictest.Proxy {
	return toxictest.New(e.t, strings.TrimPrefix(e.stubURL, "http://"))
}

func newProviderClient(base string, idempotent bool) (*provider.Client, error) {
	return provider.New(provider.Config{BaseURL: base, APIKey: testAPIKey, Timeout: 5 * time.Second, Idempotent: idempotent})
}

func providerMessage(id uuid.UUID, to, body string) provider.Message {
	return provider.Message{Key: id.String(), To: to, Body: body}
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// insertVia commits n rows with the test phones and bodies.
func insertVia(t *testing.T, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	e := &env{t: t, pool: pool}
	return e.insert(n)
}

// waitAllTerminal waits until n rows exist and all are terminal, and
// returns their statuses by id.
func waitAllTerminal(t *testing.T, pool *pgxpool.Pool, n int, d time.Duration) map[string]outbox.State {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		rows, _ := pool.Query(context.Background(), `SELECT id::text, status FROM sms_outbox`)
		out := map[string]outbox.State{}
		var id, st string
		_, err := pgx.ForEachRow(rows, []any{&id, &st}, func() error { out[id] = outbox.State(st); return nil })
		if err != nil {
			t.Fatal(err)
		}
		open := 0
		for _, s := range out {
			if !s.Terminal() {
				open++
			}
		}
		if len(out) >= n && open == 0 {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows not terminal after %s", open, len(out), d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func connectURL(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
