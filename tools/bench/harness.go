package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

// bench holds what lives across scenarios: the configuration, the database
// pool and the log directory.
type bench struct {
	cfg      config
	progress io.Writer
	pool     *pgxpool.Pool
	logDir   string
	dbName   string
	self     string
	apiKey   string
	// receiptSecret signs the stub's receipts to the receiver.
	receiptSecret string
	// polls counts the bench's own polling queries (one transaction each),
	// left out of the scenarios' commits.
	polls atomic.Int64
	// walInspect says pg_walinspect is there. walHold is the connection
	// owning a temporary replication slot that keeps a scenario's WAL on
	// disk from its start until the bench has counted it (a checkpoint,
	// the bench's or another database's, would remove it); nil between
	// scenarios. The slot goes with the connection, even when the bench
	// dies.
	walInspect bool
	walHold    *pgx.Conn
	// dbLock holds the bench's lock on its database (holdDatabase).
	dbLock *pgx.Conn
	// procs are the processes of the scenario running now, stopped at its end
	// (or by cleanup when the bench fails).
	procs []*child
}

// child is a process of a scenario: relay, sender, smsstub or the NATS
// server (its role).
type child struct {
	*proc.Process
	role string
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: "+format+"\n", args...)
}

func (b *bench) run(ctx context.Context) (*report, error) {
	c := b.cfg
	if err := proc.Binaries(c.binDir, "relay", "sender", "smsstub", "receiver"); err != nil {
		return nil, err
	}
	u, err := url.Parse(c.databaseURL)
	if err != nil || !strings.Contains(strings.TrimPrefix(u.Path, "/"), "bench") {
		return nil, errors.New("-database-url / BENCH_DATABASE_URL must be a postgres:// URL naming a database whose name contains \"bench\": its tables are emptied")
	}
	b.dbName = strings.TrimPrefix(u.Path, "/")
	if b.self, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	if b.logDir, err = os.MkdirTemp("", "sendonce-bench-"); err != nil {
		return nil, err
	}
	b.apiKey = "bench-" + uuid.NewString()
	b.receiptSecret = "bench-receipts-" + uuid.NewString()

	if _, err := proc.Run(ctx, filepath.Join(c.binDir, "relay"), []string{"migrate"},
		[]string{"DATABASE_URL=" + c.databaseURL, "LOG_FORMAT=text", "LOG_LEVEL=warn"}); err != nil {
		return nil, err
	}
	if err := b.holdDatabase(ctx); err != nil {
		return nil, err
	}
	poolCfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("-database-url: %w", err)
	}
	poolCfg.MaxConns = int32(c.writers + 4)
	if b.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return nil, fmt.Errorf("-database-url: %w", err)
	}
	b.logf("database %s migrated; logs in %s; %d CPUs", u.Redacted(), b.logDir, runtime.NumCPU())
	// The WAL of the bench database is told apart from the other
	// databases' with pg_walinspect, where the server has it.
	if _, err := b.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		b.logf("no pg_walinspect (%v): WAL figures will be the whole server's", err)
	} else {
		b.walInspect = true
	}

	rep := &report{Started: time.Now().UTC(), Host: hostInfo(), Config: configJSON(c)}
	// Other programs on the machine skew every figure: say so up front.
	idle0 := b.sampleCPU()
	time.Sleep(time.Second)
	busy := b.sampleCPU().since(idle0).MachineBusy
	rep.Host["busy_before_start"] = busy
	if busy > 0.2 {
		b.logf("WARNING: the machine is %.0f%% busy before the bench starts; figures will be low (see \"other\" in the CPU lines)", 100*busy)
	}
	type step struct {
		name string
		fn   func(context.Context, *report) error
	}
	var errs []error
	if c.selected["relay"] || c.selected["pipeline"] {
		if err := b.setupBare(ctx); err != nil {
			return nil, err
		}
		errs = append(errs, b.throughput(ctx, rep)...)
	}
	if c.selected["schedule"] {
		errs = append(errs, b.schedule(ctx, rep)...)
	}
	if c.selected["history"] {
		errs = append(errs, b.history(ctx, rep)...)
	}
	if c.selected["backlog"] && ctx.Err() == nil {
		bctx, cancel := context.WithTimeout(ctx, c.backlogTimeout)
		err := b.backlog(bctx, rep)
		cancel()
		b.stopAll()
		if err != nil {
			b.logf("[backlog] FAILED: %v", err)
			errs = append(errs, fmt.Errorf("backlog: %w", err))
		}
	}
	steps := []step{
		{"latency", b.latency},
		{"scaleout", b.scaleOut},
		{"priority", b.priority},
		{"ratelimit", b.rateLimit},
	}
	for _, st := range steps {
		if !c.selected[st.name] {
			continue
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		sctx, cancel := context.WithTimeout(ctx, c.timeout)
		err := st.fn(sctx, rep)
		cancel()
		b.stopAll()
		if err != nil {
			b.logf("[%s] FAILED: %v", st.name, err)
			errs = append(errs, fmt.Errorf("%s: %w", st.name, err))
		}
	}
	if c.selected["memory"] {
		rep.addMemoryFigures()
	}
	rep.Finished = time.Now().UTC()
	return rep, errors.Join(errs...)
}

// benchLockKey names the bench's advisory lock (a session lock belongs
// to one database, so benches on different databases do not meet).
const benchLockKey = 0x62656e6368 // "bench"

// holdDatabase takes the bench's lock on its database for the whole run,
// on a connection of its own. A bench empties the database's tables
// before each scenario, so a second one on the same database would empty
// them under the first and spend its connections: two started a minute
// apart both failed ("too many clients", "claim: 0 of 32 rows") and
// their other figures mixed the two.
func (b *bench) holdDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, b.cfg.databaseURL)
	if err != nil {
		return fmt.Errorf("-database-url: %w", err)
	}
	var held bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(benchLockKey)).Scan(&held); err != nil {
		_ = conn.Close(ctx)
		return fmt.Errorf("lock the bench database: %w", err)
	}
	if !held {
		_ = conn.Close(ctx)
		return fmt.Errorf("another bench is running on database %s: give this one a database of its own (-database-url / BENCH_DATABASE_URL)", b.dbName)
	}
	b.dbLock = conn
	return nil
}

// cleanup stops what is still running and removes the logs unless they
// are wanted.
func (b *bench) cleanup(failed bool) {
	b.stopAll()
	b.releaseWAL()
	if b.pool != nil {
		b.pool.Close()
	}
	if b.dbLock != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = b.dbLock.Close(ctx)
		cancel()
		b.dbLock = nil
	}
	if b.logDir != "" && !failed && !b.cfg.keepLogs {
		_ = os.RemoveAll(b.logDir)
		b.logDir = ""
	}
}

// start starts a child process with its output in a log file; readyMsg is
// the msg of its start-up record. The child is killed if the bench dies.
func (b *bench) start(name, role, path string, args, env []string, readyMsg string) (*child, error) {
	p, err := proc.Start(proc.Spec{Name: name, Path: path, Args: args, Env: env,
		LogFile: filepath.Join(b.logDir, name+".log"), ReadyMsg: readyMsg})
	if err != nil {
		return nil, err
	}
	c := &child{Process: p, role: role}
	b.procs = append(b.procs, c)
	return c, nil
}

// alive returns an error naming the first process that has exited.
func (b *bench) alive() error {
	for _, p := range b.procs {
		if p.Exited() {
			return fmt.Errorf("%s exited early: %s (see its log)", p.Name(), p.Status())
		}
	}
	return nil
}

// stopAll stops the scenario's processes with SIGTERM, workers first so they
// drain while the stub and NATS are still up, and waits for them.
func (b *bench) stopAll() {
	for _, role := range []string{"relay", "sender", "smsstub", "receiver", "nats"} {
		var group []*proc.Process
		for _, p := range b.procs {
			if p.role == role {
				group = append(group, p.Process)
			}
		}
		proc.StopAll(30*time.Second, group...)
		for _, p := range group {
			if n := p.Errors(); n > 0 {
				b.logf("%s logged %d errors (see %s)", p.Name(), n, filepath.Join(b.logDir, p.Name()+".log"))
			}
		}
	}
	b.procs = nil
}

// env is one scenario's broker, stub and connections.
type env struct {
	b       *bench
	name    string
	natsURL string
	stubURL string
	nc      *nats.Conn
	nats    *child
	stub    *child
	// stubArgs, senderEnv and relayEnv are a scenario's extra stub flags
	// and sender and relay settings.
	stubArgs  []string
	senderEnv []string
	relayEnv  []string
	// dbURL is the DATABASE_URL of the relay, senders and receiver; empty
	// means the bench's own (-database-url).
	dbURL string
}

// newEnv empties the outbox, starts a fresh NATS server (or clears the
// external one) and, when stubLatency is not negative, a fresh stub.
func (b *bench) newEnv(ctx context.Context, name string, stubLatency time.Duration, stubArgs ...string) (*env, error) {
	return b.newEnvWith(ctx, name, stubLatency, nil, stubArgs...)
}

// newEnvWith is newEnv with settings for the stub's environment.
func (b *bench) newEnvWith(ctx context.Context, name string, stubLatency time.Duration, stubEnv []string, stubArgs ...string) (*env, error) {
	e := &env{b: b, name: name, stubArgs: stubArgs}
	if err := b.truncate(ctx); err != nil {
		return nil, err
	}
	if b.cfg.natsURL == "" {
		dir, err := os.MkdirTemp(b.logDir, name+"-jetstream-")
		if err != nil {
			return nil, err
		}
		p, err := b.start(name+"-nats", "nats", b.self, []string{"nats-server", "-store", dir}, nil, "")
		if err != nil {
			return nil, err
		}
		u, err := p.Announced(ctx, natsAnnounce, 15*time.Second)
		if err != nil {
			return nil, err
		}
		e.natsURL, e.nats = u, p
	} else {
		e.natsURL = b.cfg.natsURL
	}
	nc, err := nats.Connect(e.natsURL, nats.Name("sendonce-bench"), nats.Timeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", e.natsURL, err)
	}
	e.nc = nc
	if b.cfg.natsURL != "" {
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, err
		}
		for _, s := range []string{streams.Stream, streams.DeadLetterStream, "KV_" + flow.DefaultBucket} {
			if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("delete stream %s: %w", s, err)
			}
		}
	}
	if stubLatency >= 0 {
		args := append([]string{"-addr", "127.0.0.1:0", "-latency", stubLatency.String(), "-log-level", "warn"}, e.stubArgs...)
		p, err := b.start(name+"-smsstub", "smsstub", filepath.Join(b.cfg.binDir, "smsstub"), args, append([]string{"SMS_API_KEY=" + b.apiKey}, stubEnv...), "")
		if err != nil {
			return nil, err
		}
		u, err := p.Announced(ctx, smsstub.Announcement, 10*time.Second)
		if err != nil {
			return nil, err
		}
		e.stubURL, e.stub = u, p
	}
	return e, nil
}

// close closes the bench's NATS connection; the processes are stopped by
// the caller of the scenario.
func (e *env) close() {
	if e.nc != nil {
		e.nc.Close()
	}
}

func (e *env) processEnv() []string {
	return []string{"DATABASE_URL=" + cmp.Or(e.dbURL, e.b.cfg.databaseURL), "NATS_URL=" + e.natsURL,
		"HTTP_ADDR=127.0.0.1:0", "LOG_FORMAT=json", "LOG_LEVEL=info"}
}

// startRelay starts a relay and waits until it has connected and created
// the streams; it returns the time of its start-up record.
func (e *env) startRelay(ctx context.Context) (time.Time, error) {
	p, err := e.b.start(e.name+"-relay", "relay", filepath.Join(e.b.cfg.binDir, "relay"), nil, append(e.processEnv(), e.relayEnv...), "relay started")
	if err != nil {
		return time.Time{}, err
	}
	return p.Ready(ctx, 30*time.Second)
}

// receiverAnnounce starts the line the receiver prints once it listens.
const receiverAnnounce = "receiver listening on "

// startReceiver starts a receiver of the stub's receipts and returns its
// base URL.
func (e *env) startReceiver(ctx context.Context) (string, error) {
	env := []string{"DATABASE_URL=" + cmp.Or(e.dbURL, e.b.cfg.databaseURL), "RECEIPTS_ADDR=127.0.0.1:0", "HTTP_ADDR=127.0.0.1:0",
		"SMS_WEBHOOK_SECRET=" + e.b.receiptSecret, "LOG_FORMAT=json", "LOG_LEVEL=info"}
	p, err := e.b.start(e.name+"-receiver", "receiver", filepath.Join(e.b.cfg.binDir, "receiver"), nil, env, "")
	if err != nil {
		return "", err
	}
	return p.Announced(ctx, receiverAnnounce, 30*time.Second)
}

// startSenders starts n senders at once and waits until every one has
// started; it returns the time of the last start-up record.
func (e *env) startSenders(ctx context.Context, n int) (time.Time, error) {
	env := append(e.processEnv(), "SMS_API_BASE="+e.stubURL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY="+e.b.apiKey,
		"SENDER_CONCURRENCY="+strconv.Itoa(e.b.cfg.concurrency))
	env = append(env, e.senderEnv...)
	var ps []*child
	for i := range n {
		p, err := e.b.start(fmt.Sprintf("%s-sender-%d", e.name, i+1), "sender", filepath.Join(e.b.cfg.binDir, "sender"), nil, env, "sender started")
		if err != nil {
			return time.Time{}, err
		}
		ps = append(ps, p)
	}
	var last time.Time
	for _, p := range ps {
		at, err := p.Ready(ctx, 30*time.Second)
		if err != nil {
			return time.Time{}, err
		}
		if at.After(last) {
			last = at
		}
	}
	return last, nil
}

// sendCounter counts the messages published on sms.send and, when asked,
// records the time each row's first publication arrived.
type sendCounter struct {
	sub   *nats.Subscription
	n     atomic.Int64
	mu    sync.Mutex
	first map[uuid.UUID]time.Time
}

// subscribe starts counting sms.send; record keeps per-row arrival times.
func (e *env) subscribe(record bool) (*sendCounter, error) {
	c := &sendCounter{}
	if record {
		c.first = make(map[uuid.UUID]time.Time, 1<<14)
	}
	// Every lane: sms.send.<priority>.
	sub, err := e.nc.Subscribe(streams.SubjectSend+".>", func(m *nats.Msg) {
		at := time.Now()
		c.n.Add(1)
		if c.first == nil {
			return
		}
		s, err := wire.Decode(m.Data)
		if err != nil {
			return
		}
		c.mu.Lock()
		if _, ok := c.first[s.ID]; !ok {
			c.first[s.ID] = at
		}
		c.mu.Unlock()
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s.>: %w", streams.SubjectSend, err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	if err := e.nc.Flush(); err != nil {
		return nil, err
	}
	c.sub = sub
	return c, nil
}

// stubStats reads the stub's counters.
func (e *env) stubStats(ctx context.Context) (smsstub.Stats, error) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return smsstub.FetchStats(sctx, e.stubURL)
}

// truncate empties the outbox, its attempts log and its evidence.
func (b *bench) truncate(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `TRUNCATE sms_evidence, sms_attempts, sms_outbox`); err != nil {
		return fmt.Errorf("empty the outbox: %w", err)
	}
	return nil
}

// copyRows writes n rows with status status through COPY in one
// transaction, then analyzes the table and checkpoints, so that every
// scenario starts from the same state (no dirty buffers from the load, a
// planner that knows the table). Numbers are fictitious and never logged.
func (b *bench) copyRows(ctx context.Context, n int, status string) error {
	return b.copyRowsWith(ctx, n, status, outbox.Normal)
}

// copyRowsWith is copyRows with the rows' priority.
func (b *bench) copyRowsWith(ctx context.Context, n int, status string, p outbox.Priority) error {
	return b.copyRowsIn(ctx, b.pool, n, status, p)
}

// copyRowsIn is copyRowsWith into the outbox pool's search_path finds.
func (b *bench) copyRowsIn(ctx context.Context, pool *pgxpool.Pool, n int, status string, p outbox.Priority) error {
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		i++
		return []any{rowID(), fmt.Sprintf("+1555%07d", i%10_000_000),
			fmt.Sprintf("Your sendonce bench code is %06d. It expires in 10 minutes.", i%1_000_000), status, int16(p)}, nil
	})
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"sms_outbox"}, []string{"id", "to_e164", "body", "status", "priority"}, src); err != nil {
		return fmt.Errorf("copy %d rows: %w", n, err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// countStatus returns how many rows of the outbox have status st.
func (b *bench) countStatus(ctx context.Context, st string) (int, error) {
	return b.countIn(ctx, "sms_outbox", st)
}

// countIn returns how many rows of table have status st.
func (b *bench) countIn(ctx context.Context, table, st string) (int, error) {
	var n int
	b.polls.Add(1)
	err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status = $1`, st).Scan(&n)
	return n, err
}

// waitUntil calls check every interval until it reports done, an error, the
// context ends, or a process exits. Every tick is bounded by ctx.
func (b *bench) waitUntil(ctx context.Context, interval time.Duration, check func() (bool, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		done, err := check()
		if err != nil || done {
			return err
		}
		if err := b.alive(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not finished: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// throttle returns a function that reports true at most once per interval.
func throttle(interval time.Duration) func() bool {
	var last time.Time
	return func() bool {
		if time.Since(last) < interval {
			return false
		}
		last = time.Now()
		return true
	}
}

// rowID mints a row id as the outbox package does: a version 7 UUID, which
// sorts by the time it was minted, so the rows a run writes land on the
// right edge of the primary key whatever the table already holds.
func rowID() uuid.UUID { return uuid.Must(uuid.NewV7()) }
