package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/outbox"
)

// calls records when each message's provider call started, by key.
type calls struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (c *calls) record(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		c.at = map[string][]time.Time{}
	}
	c.at[key] = append(c.at[key], time.Now())
}

func (c *calls) of(key string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.at[key]...)
}

// recordingSender starts a sender whose provider (the env's stub, without
// idempotency unless idem) records the start of every call first.
func (e *env) recordingSender(c *calls, idem bool, cfg sender.Config) func() {
	e.t.Helper()
	p, err := provider.New(provider.Config{BaseURL: e.stubURL, APIKey: testAPIKey, Timeout: 2 * time.Second, Idempotent: idem})
	if err != nil {
		e.t.Fatal(err)
	}
	h := &hookProv{Client: p}
	h.send = func(ctx context.Context, m provider.Message) provider.Outcome {
		c.record(m.Key)
		return p.Send(ctx, m)
	}
	cfg.Provider = h
	return e.startSender(senderOptions{cfg: cfg})
}

// appPool is a pool acting as the application's role.
func (e *env) appPool() *pgxpool.Pool {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg.MaxConns = 8
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE sendonce_app`)
		return err
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

// A form posted twice, a thousand times over, while the pipeline runs:
// each pair writes the same key at once from two connections, one through
// the Go API and one as plain SQL (INSERT ... ON CONFLICT DO NOTHING). One
// row per key, one SMS per key.
func TestConcurrentDuplicatesAreOneIntent(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	stop := e.startSender(senderOptions{})
	defer stop()
	app := e.appPool()
	ctx := context.Background()
	const pairs = 1000
	keys := make([]string, pairs)
	var wg sync.WaitGroup
	errs := make(chan error, 2*pairs)
	sem := make(chan struct{}, 8)
	for i := range pairs {
		keys[i] = fmt.Sprintf("order:%d:confirmation:%s", i, uuid.NewString()[:8])
		to, body := testPhone(i), testBody(i)
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			<-start
			errs <- pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, to, body, outbox.WithKey(keys[i]))
				return err
			})
		}()
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			<-start
			_, err := app.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, idempotency_key) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
				uuid.New(), to, body, keys[i])
			errs <- err
		}()
		close(start)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows, distinct int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT idempotency_key) FROM sms_outbox WHERE idempotency_key = ANY($1)`, keys).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != pairs || distinct != pairs {
		t.Fatalf("%d rows for %d keys (%d distinct); want one row per key", rows, pairs, distinct)
	}
	var ids []uuid.UUID
	r, _ := e.pool.Query(ctx, `SELECT id FROM sms_outbox WHERE idempotency_key = ANY($1)`, keys)
	ids, err := pgx.CollectRows(r, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	e.waitAllSent(ids, 120*time.Second)
	perNumber := map[string]int{}
	for _, d := range e.stub.Deliveries() {
		perNumber[d.To] += d.Deliveries
	}
	for i := range pairs {
		if n := perNumber[testPhone(i)]; n != 1 {
			t.Errorf("number %d got %d messages; want 1", i, n)
		}
	}
}

// Rows that expire while every sender is stopped end expired, and no call
// is ever made for them, neither while the senders are down nor when they
// come back.
func TestRowsThatExpireWhileSendersAreStoppedAreNeverCalled(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	_, stopRelay := e.startRelay(relay.Config{TimeInterval: 50 * time.Millisecond})
	defer stopRelay()
	ctx := context.Background()
	expires := time.Now().Add(2 * time.Second)
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var msgs []outbox.Message
		for i := range 200 {
			msgs = append(msgs, outbox.Message{To: testPhone(i), Body: testBody(i), ExpiresAt: expires})
		}
		var err error
		ids, err = outbox.EnqueueBatch(ctx, tx, msgs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows := e.waitTerminal(ids, 30*time.Second)
	for _, id := range ids {
		if rows[id].status != outbox.StatusExpired {
			t.Fatalf("row %s: %s, want expired", id, rows[id].status)
		}
	}
	var c calls
	stop := e.recordingSender(&c, false, sender.Config{})
	defer stop()
	time.Sleep(2 * time.Second)
	for _, id := range ids {
		if n := len(c.of(id.String())); n != 0 || e.stub.Deliveries()[id.String()].Requests != 0 {
			t.Fatalf("row %s, expired, was called %d times", id, n)
		}
	}
}

// A row whose call is in flight when its expiry comes is never expired if
// the provider took it: the calls start before the expiry, the provider
// takes them at once and its answers come after the client gave up (past
// the expiry); the lookup that follows settles each one sent, never
// expired.
func TestACallInFlightAtExpiryIsSettledByEvidence(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	proxy := e.newProxy()
	proxy.Add("slow", "latency", "downstream", map[string]any{"latency": 3500})
	_, stopRelay := e.startRelay(relay.Config{TimeInterval: 50 * time.Millisecond})
	defer stopRelay()
	stop := e.startSender(senderOptions{baseURL: proxy.URL(), lookup: true, idempotent: ptrTo(false), timeout: 2500 * time.Millisecond,
		cfg: sender.Config{LookupSettle: 500 * time.Millisecond}})
	defer stop()
	ctx := context.Background()
	var ids []uuid.UUID
	expires := time.Now().Add(time.Second)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var msgs []outbox.Message
		for i := range 20 {
			msgs = append(msgs, outbox.Message{To: testPhone(i), Body: testBody(i), ExpiresAt: expires})
		}
		var err error
		ids, err = outbox.EnqueueBatch(ctx, tx, msgs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every call has reached the provider, and the expiry has passed,
	// before the answers come back: then the lookups get through.
	testkit.WaitFor(t, 30*time.Second, "every message taken", func() bool {
		n := 0
		for _, id := range ids {
			n += e.stub.Deliveries()[id.String()].Deliveries
		}
		return n == len(ids)
	})
	time.Sleep(time.Until(expires) + 100*time.Millisecond)
	proxy.Remove("slow")
	rows := e.waitTerminal(ids, 60*time.Second)
	got := e.stub.Deliveries()
	for _, id := range ids {
		d := got[id.String()]
		switch {
		case d.Deliveries > 1:
			t.Errorf("row %s delivered %d times", id, d.Deliveries)
		case d.Deliveries == 1 && rows[id].status.Unsent():
			t.Errorf("row %s was taken by the provider but ended %s (%s)", id, rows[id].status, rows[id].lastErr)
		case d.Deliveries == 0 && rows[id].status != outbox.StatusExpired:
			t.Errorf("row %s never reached the provider but ended %s (%s)", id, rows[id].status, rows[id].lastErr)
		case d.Deliveries == 1 && rows[id].status != outbox.StatusSent:
			t.Errorf("row %s, taken, ended %s (%s); want sent, by its lookup", id, rows[id].status, rows[id].lastErr)
		}
	}
}

// Scheduled rows: none is called before its send time; each is called
// once, soon after it.
func TestScheduledRowsAreNeverCalledEarly(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	var c calls
	stop := e.recordingSender(&c, true, sender.Config{})
	defer stop()
	ctx := context.Background()
	base := time.Now().Add(2 * time.Second)
	sendAt := map[uuid.UUID]time.Time{}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		for i := range 100 {
			at := base.Add(time.Duration(i) * 20 * time.Millisecond)
			id, err := outbox.Enqueue(ctx, tx, testPhone(i), testBody(i), outbox.WithSendAt(at))
			if err != nil {
				return err
			}
			sendAt[id] = at
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for id := range sendAt {
		ids = append(ids, id)
	}
	e.waitAllSent(ids, 60*time.Second)
	var worst time.Duration
	for id, at := range sendAt {
		cs := c.of(id.String())
		if len(cs) != 1 {
			t.Errorf("row %s called %d times", id, len(cs))
			continue
		}
		if cs[0].Before(at) {
			t.Errorf("row %s called %s before its send time", id, at.Sub(cs[0]))
		}
		worst = max(worst, cs[0].Sub(at))
	}
	t.Logf("latest call after its send time: %s", worst)
}

// Cancel against a running pipeline: each row is either cancelled and
// never called, or called once and not cancelled.
func TestCancelRacesTheSenders(t *testing.T) {
	t.Parallel()
	// A provider slow enough that the sends and the cancels overlap.
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{Latency: 20 * time.Millisecond}}})
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	var c calls
	stop := e.recordingSender(&c, false, sender.Config{Concurrency: 4})
	defer stop()
	app := e.appPool()
	ctx := context.Background()
	ids := e.insert(500)
	var mu sync.Mutex
	said := map[uuid.UUID]outbox.State{}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			time.Sleep(time.Duration(i%100) * 20 * time.Millisecond)
			st, err := outbox.Cancel(ctx, app, id)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			said[id] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	rows := e.waitTerminal(ids, 60*time.Second)
	cancelled := 0
	for _, id := range ids {
		n := len(c.of(id.String()))
		switch st := rows[id].status; {
		case st == outbox.StatusCancelled && n != 0:
			t.Errorf("row %s cancelled and called %d times", id, n)
		case st == outbox.StatusCancelled:
			cancelled++
			if said[id] != outbox.StatusCancelled {
				t.Errorf("row %s ended cancelled, but Cancel said %s", id, said[id])
			}
		case n != 1 || e.stub.Deliveries()[id.String()].Deliveries != 1:
			t.Errorf("row %s: %s, %d calls; want sent once", id, st, n)
		case said[id] == outbox.StatusCancelled:
			t.Errorf("row %s: Cancel said cancelled, but it is %s", id, st)
		}
	}
	t.Logf("%d of %d rows cancelled before a call, the rest sent once", cancelled, len(ids))
	if cancelled == 0 || cancelled == len(ids) {
		t.Errorf("%d of %d cancelled: the race was not run", cancelled, len(ids))
	}
}

func ptrTo[T any](v T) *T { return &v }
