package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/wire"
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
	// procs are the processes of the scenario running now, stopped at its end
	// (or by cleanup when the bench fails).
	procs []*proc
}

// proc is a child process: relay, sender, smsstub or the NATS server.
type proc struct {
	name, role string
	cmd        *exec.Cmd
	done       chan struct{}
	err        error
	// first is the first line the process printed on stdout (its address).
	first chan string
	// ready receives the time field of the log record announcing start-up.
	ready         chan time.Time
	warns, errors atomic.Int64
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: "+format+"\n", args...)
}

func (b *bench) run(ctx context.Context) (*report, error) {
	c := b.cfg
	for _, bin := range []string{"relay", "sender", "smsstub"} {
		if _, err := os.Stat(filepath.Join(c.binDir, bin)); err != nil {
			return nil, fmt.Errorf("binary %s not found in %s (run make build): %w", bin, c.binDir, err)
		}
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

	migrate := exec.CommandContext(ctx, filepath.Join(c.binDir, "relay"), "migrate")
	migrate.Env = append(os.Environ(), "DATABASE_URL="+c.databaseURL, "LOG_FORMAT=text", "LOG_LEVEL=warn")
	if out, err := migrate.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("relay migrate: %v\n%s", err, out)
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
	steps := []step{
		{"relay", b.relayDrain},
		{"pipeline", b.pipeline},
		{"latency", b.latency},
		{"scaleout", b.scaleOut},
	}
	var errs []error
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

// cleanup stops what is still running and removes the logs unless they
// are wanted.
func (b *bench) cleanup(failed bool) {
	b.stopAll()
	if b.pool != nil {
		b.pool.Close()
	}
	if b.logDir != "" && !failed && !b.cfg.keepLogs {
		_ = os.RemoveAll(b.logDir)
		b.logDir = ""
	}
}

// start starts a child process. Its stderr goes to a log file and is
// scanned for the start-up record whose msg is readyMsg; its first stdout
// line is kept. The child is killed if the bench dies.
func (b *bench) start(name, role, path string, args, env []string, readyMsg string) (*proc, error) {
	logFile, err := os.Create(filepath.Join(b.logDir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, role: role, cmd: cmd, done: make(chan struct{}),
		first: make(chan string, 1), ready: make(chan time.Time, 1)}
	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() {
		defer pipes.Done()
		sc := bufio.NewScanner(stdout)
		first := true
		for sc.Scan() {
			if first {
				p.first <- sc.Text()
				first = false
			}
		}
		close(p.first)
	}()
	go func() {
		defer pipes.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		announced := false
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logFile.Write(append(line, '\n'))
			var rec struct {
				Time  time.Time `json:"time"`
				Level string    `json:"level"`
				Msg   string    `json:"msg"`
			}
			if json.Unmarshal(line, &rec) != nil {
				continue
			}
			switch rec.Level {
			case "WARN":
				p.warns.Add(1)
			case "ERROR":
				p.errors.Add(1)
			}
			if !announced && readyMsg != "" && rec.Msg == readyMsg {
				announced = true
				p.ready <- rec.Time
			}
		}
	}()
	go func() {
		pipes.Wait() // Wait closes the pipes: read them to the end first
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	b.procs = append(b.procs, p)
	return p, nil
}

// waitReady waits for the process's start-up record and returns its time.
func (p *proc) waitReady(ctx context.Context, d time.Duration) (time.Time, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case at := <-p.ready:
		return at, nil
	case <-p.done:
		return time.Time{}, fmt.Errorf("%s exited during start-up: %v (see its log)", p.name, p.err)
	case <-t.C:
		return time.Time{}, fmt.Errorf("%s not started within %s", p.name, d)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// firstLine waits for the first line the process prints on stdout.
func (p *proc) firstLine(d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case l, ok := <-p.first:
		if !ok {
			return "", fmt.Errorf("%s exited before printing its address", p.name)
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("%s printed no address within %s", p.name, d)
	}
}

// alive returns an error naming the first process that has exited.
func (b *bench) alive() error {
	for _, p := range b.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited early: %v (see its log)", p.name, p.err)
		default:
		}
	}
	return nil
}

// stopAll stops the scenario's processes with SIGTERM, workers first so they
// drain while the stub and NATS are still up, and waits for them.
func (b *bench) stopAll() {
	order := []string{"relay", "sender", "smsstub", "nats"}
	for _, role := range order {
		var group []*proc
		for _, p := range b.procs {
			if p.role == role {
				group = append(group, p)
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, p := range group {
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
			if n := p.errors.Load(); n > 0 {
				b.logf("%s logged %d errors (see %s)", p.name, n, filepath.Join(b.logDir, p.name+".log"))
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
	nats    *proc
	stub    *proc
}

// newEnv empties the outbox, starts a fresh NATS server (or clears the
// external one) and, when stubLatency is not negative, a fresh stub.
func (b *bench) newEnv(ctx context.Context, name string, stubLatency time.Duration) (*env, error) {
	e := &env{b: b, name: name}
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
		line, err := p.firstLine(15 * time.Second)
		if err != nil {
			return nil, err
		}
		u, ok := strings.CutPrefix(line, natsAnnounce)
		if !ok {
			return nil, fmt.Errorf("nats-server printed %q", line)
		}
		e.natsURL, e.nats = strings.TrimSpace(u), p
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
		for _, s := range []string{streams.Stream, streams.DeadLetterStream} {
			if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("delete stream %s: %w", s, err)
			}
		}
	}
	if stubLatency >= 0 {
		args := []string{"-addr", "127.0.0.1:0", "-latency", stubLatency.String(), "-log-level", "warn"}
		p, err := b.start(name+"-smsstub", "smsstub", filepath.Join(b.cfg.binDir, "smsstub"), args, []string{"SMS_API_KEY=" + b.apiKey}, "")
		if err != nil {
			return nil, err
		}
		line, err := p.firstLine(10 * time.Second)
		if err != nil {
			return nil, err
		}
		u, ok := strings.CutPrefix(line, "smsstub listening on ")
		if !ok {
			return nil, fmt.Errorf("smsstub printed %q", line)
		}
		e.stubURL, e.stub = strings.TrimSpace(u), p
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
	return []string{"DATABASE_URL=" + e.b.cfg.databaseURL, "NATS_URL=" + e.natsURL,
		"HTTP_ADDR=127.0.0.1:0", "LOG_FORMAT=json", "LOG_LEVEL=info"}
}

// startRelay starts a relay and waits until it has connected and created
// the streams; it returns the time of its start-up record.
func (e *env) startRelay(ctx context.Context) (time.Time, error) {
	p, err := e.b.start(e.name+"-relay", "relay", filepath.Join(e.b.cfg.binDir, "relay"), nil, e.processEnv(), "relay started")
	if err != nil {
		return time.Time{}, err
	}
	return p.waitReady(ctx, 30*time.Second)
}

// startSenders starts n senders at once and waits until every one has
// started; it returns the time of the last start-up record.
func (e *env) startSenders(ctx context.Context, n int) (time.Time, error) {
	env := append(e.processEnv(), "SMS_API_BASE="+e.stubURL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY="+e.b.apiKey,
		"SENDER_CONCURRENCY="+strconv.Itoa(e.b.cfg.concurrency))
	var ps []*proc
	for i := range n {
		p, err := e.b.start(fmt.Sprintf("%s-sender-%d", e.name, i+1), "sender", filepath.Join(e.b.cfg.binDir, "sender"), nil, env, "sender started")
		if err != nil {
			return time.Time{}, err
		}
		ps = append(ps, p)
	}
	var last time.Time
	for _, p := range ps {
		at, err := p.waitReady(ctx, 30*time.Second)
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
	sub, err := e.nc.Subscribe(streams.SubjectSend, func(m *nats.Msg) {
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
		return nil, fmt.Errorf("subscribe %s: %w", streams.SubjectSend, err)
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

// truncate empties the outbox and the attempts log.
func (b *bench) truncate(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `TRUNCATE sms_attempts, sms_outbox`); err != nil {
		return fmt.Errorf("empty the outbox: %w", err)
	}
	return nil
}

// copyRows writes n rows with status status through COPY in one
// transaction, then analyzes the table and checkpoints, so that every
// scenario starts from the same state (no dirty buffers from the load, a
// planner that knows the table). Numbers are fictitious and never logged.
func (b *bench) copyRows(ctx context.Context, n int, status string) error {
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		i++
		return []any{uuid.New(), fmt.Sprintf("+1555%07d", i%10_000_000),
			fmt.Sprintf("Your sendonce bench code is %06d. It expires in 10 minutes.", i%1_000_000), status}, nil
	})
	if _, err := b.pool.CopyFrom(ctx, pgx.Identifier{"sms_outbox"}, []string{"id", "to_e164", "body", "status"}, src); err != nil {
		return fmt.Errorf("copy %d rows: %w", n, err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE sms_outbox`); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	if _, err := b.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// countStatus returns how many rows have status st.
func (b *bench) countStatus(ctx context.Context, st string) (int, error) {
	var n int
	err := b.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE status = $1`, st).Scan(&n)
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
