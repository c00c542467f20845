package main

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/natscluster"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// soak is one run: its infrastructure, processes, load and faults.
type soak struct {
	cfg    config
	stdout io.Writer
	stderr io.Writer
	rng    *rand.Rand // the fault schedule's; used by the fault loop only
	start  time.Time

	outMu   sync.Mutex // serialises stderr lines
	logFile *os.File   // soak.log in logDir: a copy of the stderr lines

	logDir     string
	directURL  string // the database, reached directly (set-up, writers, checks)
	proxiedURL string // the database through dbProxies (relays, senders, receiver)
	pool       *pgxpool.Pool
	broker     *broker              // the single server (no -cluster)
	cluster    *natscluster.Cluster // -cluster
	pg         *pgPair              // a primary and a standby: -drill pg-failover, and the pg_failover fault
	pgLost     *pgLosses            // what failovers lost with the old primaries (with pg)
	drill      *drill               // the drill, once it ran
	dbProxies  []*tcpProxy          // in front of Postgres: one, or one per server of pg
	apiProxy   *tcpProxy
	stub       *stubProc
	apiKey     string // the stub's API key, or its Twilio auth token
	twilioSID  string // -provider twilio: the stub's account
	relays     []*slot
	senders    []*slot
	receivers  []*slot // -provider lookup: the receiver of the stub's receipts

	load   *loader
	faults faultCounts

	unexpected   atomic.Int64 // processes that exited without being told to
	termUnclean  atomic.Int64 // SIGTERMed processes that did not exit 0
	cpMissed     atomic.Int64 // crash points armed but not reached in time
	watchdogStop chan struct{}
	watchdogDone chan struct{}
	progressStop chan struct{}
	progressDone chan struct{}
}

func newSoak(c config, stdout, stderr io.Writer) *soak {
	seed := uint64(c.seed)
	return &soak{
		cfg: c, stdout: stdout, stderr: stderr,
		rng:   rand.New(rand.NewPCG(seed, seed^0x5eed0ce)),
		start: time.Now(),
	}
}

// logf writes one line to stderr, prefixed with the time since the start.
func (s *soak) logf(format string, args ...any) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	line := fmt.Sprintf("soak %s: %s\n", clock(time.Since(s.start)), fmt.Sprintf(format, args...))
	_, _ = io.WriteString(s.stderr, line)
	if s.logFile != nil {
		_, _ = io.WriteString(s.logFile, line)
	}
}

// clock formats d as m:ss.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d/time.Minute), int(d%time.Minute/time.Second))
}

func (s *soak) slots() []*slot {
	return append(append(append([]*slot{}, s.relays...), s.senders...), s.receivers...)
}

// lookups reports whether the soak plays a provider without idempotency
// that the senders look up and that sends receipts (-provider lookup or
// twilio).
func (s *soak) lookups() bool {
	return s.cfg.provider == providerLookup || s.cfg.provider == providerTwilio || s.cfg.provider == providerFailover
}

// twilio reports whether the senders speak to the stub's Twilio facade
// (-provider twilio, or failover's second provider).
func (s *soak) twilio() bool {
	return s.cfg.provider == providerTwilio || s.cfg.provider == providerFailover || s.cfg.provider == providerPair
}

// sweepsReceipts reports whether the senders look up the rows whose receipt
// is overdue, after a minute: where they look up, but in a drill with the
// defaults' timings (an hour).
func (s *soak) sweepsReceipts() bool {
	return s.lookups() && (s.cfg.drill == "" || s.cfg.drillShort)
}

// runsPGPair reports whether Postgres runs as a primary and a streaming
// standby of the soak's own: for the failover drill, and for the
// pg_failover fault of the soaks with lookups.
func (s *soak) runsPGPair() bool {
	return s.cfg.drill == "pg-failover" || s.cfg.drill == "" && s.lookups()
}

// run sets everything up, runs the load and the faults, waits for the rows
// to finish and checks them. failed reports a duplicate or a loss; err a
// soak that could not run.
func (s *soak) run(ctx context.Context) (failed bool, err error) {
	if s.logDir, err = os.MkdirTemp("", "sendonce-soak-"); err != nil {
		return false, err
	}
	if f, err := os.Create(filepath.Join(s.logDir, "soak.log")); err == nil {
		s.outMu.Lock()
		s.logFile = f
		s.outMu.Unlock()
	}
	if err := checkBinaries(s.cfg.binDir, s.lookups()); err != nil {
		return false, err
	}
	if s.cfg.drill != "" {
		s.logf("seed %d; rows %d over %s; drill %s when %.0f%% of the rows are committed; %s provider; logs in %s",
			s.cfg.seed, s.cfg.rows, s.cfg.loadDuration, s.cfg.drill, 100*s.cfg.drillAt, s.cfg.provider, s.logDir)
	} else {
		s.logf("seed %d; rows %d over %s; a fault every %s-%s; %s provider; logs in %s",
			s.cfg.seed, s.cfg.rows, s.cfg.loadDuration, s.cfg.faultInterval/3, s.cfg.faultInterval, s.cfg.provider, s.logDir)
	}

	s.directURL = s.cfg.databaseURL
	if s.runsPGPair() {
		if err := s.startPGPair(ctx); err != nil {
			return false, err
		}
	} else {
		if err := recreateDatabase(ctx, s.directURL); err != nil {
			return false, err
		}
		if err := s.migrate(ctx); err != nil {
			return false, err
		}
	}
	if s.pool, err = newPool(ctx, s.directURL, s.cfg.writers+4); err != nil {
		return false, err
	}

	if err := s.startNATS(ctx); err != nil {
		return false, err
	}
	s.faults.kinds = s.kinds()
	if s.cfg.drill != "" {
		s.faults.kinds = []string{strings.ReplaceAll(s.cfg.drill, "-", "_")}
	}
	pgDesc := "postgres: the pair's multi-host DSN over its proxies"
	if s.pg == nil {
		pgAddr, err := hostPort(s.directURL, "5432")
		if err != nil {
			return false, err
		}
		proxy, err := newTCPProxy("postgres", pgAddr)
		if err != nil {
			return false, err
		}
		s.dbProxies = []*tcpProxy{proxy}
		u, _ := url.Parse(s.directURL)
		u.Host = proxy.addr()
		s.proxiedURL = u.String()
		pgDesc = fmt.Sprintf("postgres %s via proxy %s", pgAddr, proxy.addr())
	}

	// One secret a run: the stub's API key, or its Twilio auth token.
	s.apiKey = "soak-" + uuid.NewString()
	if s.twilio() {
		s.twilioSID = "AC" + strings.ReplaceAll(uuid.NewString(), "-", "")
	}
	if s.stub, err = startStub(ctx, s.cfg.binDir, s.logDir, s.apiKey, s.cfg.provider, s.twilioSID); err != nil {
		return false, err
	}
	stubAddr, err := hostPort(s.stub.url, "80")
	if err != nil {
		return false, err
	}
	if s.apiProxy, err = newTCPProxy("provider", stubAddr); err != nil {
		return false, err
	}
	s.logf("%s; %s; stub %s via proxy %s", s.natsDescription(), pgDesc, s.stub.url, s.apiProxy.addr())

	common := []string{
		"DATABASE_URL=" + s.proxiedURL, "NATS_URL=" + s.natsURL(), fmt.Sprintf("NATS_REPLICAS=%d", s.replicas()),
		"LOG_FORMAT=json", "HTTP_ADDR=127.0.0.1:0", "SHUTDOWN_TIMEOUT=10s",
	}
	relayEnv := append(common[:len(common):len(common)], "RECONCILE_INTERVAL=2s", "RECONCILE_GRACE=40s")
	providerEnv := append(common[:len(common):len(common)], "SMS_API_BASE="+s.apiProxy.url(), "SMS_API_ALLOW_INSECURE=true")
	switch s.cfg.provider {
	case providerTwilio:
		providerEnv = append(providerEnv, "SMS_PROVIDER=twilio", "TWILIO_ACCOUNT_SID="+s.twilioSID,
			"TWILIO_AUTH_TOKEN="+s.apiKey, "TWILIO_FROM="+twilioFrom)
	case providerFailover, providerPair:
		// The faults act on the first (through the proxy); the second is
		// the same stub's Twilio facade, reached directly.
		providerEnv = append(providerEnv, "SMS_PROVIDERS=generic,twilio", "SMS_API_KEY="+s.apiKey,
			"TWILIO_API_BASE="+s.stub.url, "TWILIO_ACCOUNT_SID="+s.twilioSID, "TWILIO_AUTH_TOKEN="+s.apiKey, "TWILIO_FROM="+twilioFrom)
	default:
		providerEnv = append(providerEnv, "SMS_API_KEY="+s.apiKey)
	}
	senderEnv := append(providerEnv[:len(providerEnv):len(providerEnv)],
		"SMS_API_TIMEOUT=1s", "RETRY_BASE=100ms", "RETRY_CAP=2s", "SENDER_LEASE=3s", "SENDER_CONCURRENCY=32",
		fmt.Sprintf("SMS_API_IDEMPOTENT=%t", s.cfg.provider == providerIdempotent || s.cfg.provider == providerPair))
	if s.cfg.provider == providerPair {
		// No receiver: the callback URL only carries each message's row
		// id to the stub's Twilio facade, which keys its deliveries by it.
		senderEnv = append(senderEnv, "RECEIPTS_PUBLIC_URL=http://127.0.0.1:1", "RECEIPTS_ALLOW_INSECURE=true")
	}
	if s.cfg.drill != "" && !s.cfg.drillShort {
		// A drill times the recovery a deployment that changed nothing
		// would see: every timing setting at its default.
		relayEnv = common
		senderEnv = providerEnv
	}
	if s.lookups() {
		// The receiver on a port fixed for the run, so that a restarted
		// receiver is where the callback URLs already sent point.
		port, err := testport.Pick()
		if err != nil {
			return false, err
		}
		receiverURL := fmt.Sprintf("http://127.0.0.1:%d", port)
		receiverEnv := []string{
			"DATABASE_URL=" + s.proxiedURL, "LOG_FORMAT=json", "HTTP_ADDR=127.0.0.1:0", "SHUTDOWN_TIMEOUT=10s",
			fmt.Sprintf("RECEIPTS_ADDR=127.0.0.1:%d", port),
		}
		if s.twilio() {
			// Twilio signs the URL it calls: the receiver must know it.
			receiverEnv = append(receiverEnv, "TWILIO_AUTH_TOKEN="+s.apiKey, "RECEIPTS_PUBLIC_URL="+receiverURL, "RECEIPTS_ALLOW_INSECURE=true")
		}
		if s.cfg.provider != providerTwilio {
			receiverEnv = append(receiverEnv, "SMS_WEBHOOK_SECRET="+receiptSecret)
		}
		s.receivers = append(s.receivers, s.newSlot("receiver-1", "receiver", receiverEnv))
		senderEnv = append(senderEnv, "SMS_API_IDEMPOTENT=false", "SMS_API_LOOKUP=true",
			"RECEIPTS_PUBLIC_URL="+receiverURL, "RECEIPTS_ALLOW_INSECURE=true") // a local receiver
		if s.sweepsReceipts() {
			// The stub shows an accepted message to a lookup at once; a
			// receipt not come within a minute is asked for (the shortest
			// SENDER_RECEIPT_OVERDUE), fast enough for a soak's end.
			senderEnv = append(senderEnv, "SMS_API_LOOKUP_SETTLE=1s", "SENDER_RECEIPT_OVERDUE=1m", "SENDER_RECEIPT_OVERDUE_RATE=50")
		}
		s.logf("receiver %s; senders look up an unanswered attempt; the stub sends receipts (numbers ending %s undelivered)", receiverURL, undeliveredSuffix)
		if s.twilio() {
			s.logf("twilio: the rows go to %d numbers, at most %d to one (%d pages of 100 in a lookup; the adapter reads up to %d)",
				numberPool(s.cfg.rows), rowsPerNumber, (rowsPerNumber+99)/100, provider.DefaultTwilioLookupPages)
		}
	}
	for i := range 2 {
		s.relays = append(s.relays, s.newSlot(fmt.Sprintf("relay-%d", i+1), "relay", relayEnv))
	}
	for i := range 3 {
		s.senders = append(s.senders, s.newSlot(fmt.Sprintf("sender-%d", i+1), "sender", senderEnv))
	}
	for _, sl := range s.slots() {
		sl.mu.Lock()
		err := sl.startLocked(ctx, nil)
		sl.mu.Unlock()
		if err != nil {
			return false, err
		}
	}
	s.logf("started %s", s.processDescription())
	if s.cfg.drill != "" {
		// A slow provider until the failure, so that a backlog builds:
		// rows queued in the stream when its store goes, rows sent after
		// the replication link was cut. Those are the rows only the
		// reconciler can bring back.
		if err := s.setStubFaults(ctx, smsstub.Faults{Latency: drillLatency}); err != nil {
			return false, err
		}
	}

	s.watchdogStop, s.watchdogDone = make(chan struct{}), make(chan struct{})
	go s.watchdog(ctx)
	s.progressStop, s.progressDone = make(chan struct{}), make(chan struct{})
	go s.progress(ctx)

	// The load and, alongside it, the faults.
	s.load = newLoader(s.pool, s.cfg.rows, s.cfg.writers, s.cfg.loadDuration, s.logf)
	if s.twilio() {
		s.load.numbers = numberPool(s.cfg.rows)
	}
	loadErr := make(chan error, 1)
	go func() { loadErr <- s.load.run(ctx) }()
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		if s.cfg.drill != "" {
			s.drillLoop(ctx)
			return
		}
		s.faultLoop(ctx, s.load.done)
	}()
	err = <-loadErr
	<-faultsDone
	if err != nil {
		return false, fmt.Errorf("load: %w", err)
	}
	s.logf("load done: %d rows committed; faults %s", s.load.committed(), s.faults.summary())

	if err := s.restore(ctx); err != nil {
		return false, err
	}
	s.logf("faults restored; %s running; waiting up to %s for every row to finish", s.processDescription(), s.cfg.drainTimeout)
	if err := s.waitTerminal(ctx, s.cfg.drainTimeout); err != nil {
		return false, err
	}
	if s.lookups() {
		// Receipts come a little after a row is sent; the stub tries each
		// for about half a minute.
		wait := time.Minute
		if s.sweepsReceipts() {
			// A row sent at the end of the load is a minute from its first
			// overdue look, and a failed look waits two more.
			wait = 4 * time.Minute
		}
		if err := s.waitReceipts(ctx, wait); err != nil {
			return false, err
		}
	}
	// A row that ended dead or unknown gets its dead letter after its
	// status; one whose sender died in between gets it from the reconciler.
	if err := s.waitLetters(ctx, 2*time.Minute); err != nil {
		return false, err
	}
	close(s.progressStop)
	<-s.progressDone
	s.progressStop = nil

	res, err := s.check(ctx)
	if err != nil {
		return false, err
	}
	fmt.Fprintln(s.stdout, res.line(time.Since(s.start)))
	if res.failovers != "" {
		fmt.Fprintln(s.stdout, res.failovers)
	}
	if s.drill != nil {
		fmt.Fprintln(s.stdout, s.drill.line())
	}
	if res.failed() {
		s.diagnose(ctx, res)
		return true, nil
	}
	return false, nil
}

// restore lifts every fault and makes every process run.
func (s *soak) restore(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var errs []error
	if _, err := smsstub.PostFaults(rctx, s.stub.url, smsstub.Faults{}); err != nil {
		errs = append(errs, err)
	}
	for _, p := range append([]*tcpProxy{s.apiProxy}, s.dbProxies...) {
		if p == nil {
			continue
		}
		if err := p.restore(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.restoreNATS(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, sl := range s.slots() {
		sl.mu.Lock()
		if !sl.running() {
			if err := sl.startLocked(ctx, nil); err != nil {
				errs = append(errs, err)
			}
		}
		sl.mu.Unlock()
	}
	if len(errs) > 0 {
		return fmt.Errorf("restore: %v", errs)
	}
	return nil
}

// hold keeps everything running after a failure so that it can be inspected.
func (s *soak) hold(ctx context.Context) {
	s.logf("holding for inspection (SIGINT or %s ends it); from another shell:", s.cfg.holdMax)
	s.logf("  export DATABASE_URL='%s' NATS_URL='%s'", s.directURL, s.natsURL())
	s.logf("  %s trace ID", filepath.Join(s.cfg.binDir, "relay"))
	s.logf("  curl -s %s/admin/deliveries; curl -s %s/admin/stats", s.stub.url, s.stub.url)
	s.logf("  logs: %s", s.logDir)
	select {
	case <-ctx.Done():
	case <-time.After(s.cfg.holdMax):
	}
}

// cleanup stops every process (SIGTERM, SIGKILL after a bound), the broker
// and the proxies, and removes the log directory unless it is to be kept.
func (s *soak) cleanup(failed bool) {
	if s.progressStop != nil {
		close(s.progressStop)
		<-s.progressDone
	}
	if s.watchdogStop != nil {
		close(s.watchdogStop)
		<-s.watchdogDone
	}
	var wg sync.WaitGroup
	for _, sl := range s.slots() {
		wg.Go(func() {
			sl.mu.Lock()
			defer sl.mu.Unlock()
			if p := sl.cur.Load(); p != nil && !p.Exited() {
				if !p.Stop(syscall.SIGTERM, 20*time.Second) {
					s.logf("%s did not stop within 20s of SIGTERM; killed", sl.name)
				}
			}
		})
	}
	wg.Wait()
	if s.stub != nil {
		s.stub.stop()
	}
	s.stopNATS()
	if s.pg != nil {
		s.pg.stop(failed || s.cfg.keepLogs, s.logf) // its proxies too
	} else {
		for _, p := range s.dbProxies {
			p.close()
		}
	}
	if s.apiProxy != nil {
		s.apiProxy.close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if s.logDir == "" {
		return
	}
	if failed || s.cfg.keepLogs {
		s.logf("logs kept in %s", s.logDir)
		return
	}
	s.outMu.Lock()
	if s.logFile != nil {
		s.logFile.Close()
		s.logFile = nil
	}
	s.outMu.Unlock()
	_ = os.RemoveAll(s.logDir)
}

// hostPort returns the host:port of a URL, with defPort when it has none.
func hostPort(raw, defPort string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	port := u.Port()
	if port == "" {
		port = defPort
	}
	host := u.Hostname()
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// checkBinaries makes sure the relay and the sender in binDir were built
// with the crash points compiled in (a default build ignores the variable,
// and the crashpoint fault would prove nothing), and the stub (and with
// receiver, the receiver) is there.
func checkBinaries(binDir string, receiver bool) error {
	bins := []string{"relay", "sender", "smsstub"}
	if receiver {
		bins = append(bins, "receiver")
	}
	for _, b := range bins {
		path := filepath.Join(binDir, b)
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			return fmt.Errorf("binary %s in %s (run make soak, which builds them): %w", b, binDir, err)
		}
		if b == "smsstub" || b == "receiver" {
			continue
		}
		tagged := false
		for _, s := range info.Settings {
			if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), crashpoint.Tag) {
				tagged = true
			}
		}
		if !tagged {
			return fmt.Errorf("%s was built without -tags %s, so its crash points do nothing (make soak builds tagged binaries into bin/crash)", path, crashpoint.Tag)
		}
	}
	return nil
}

// processDescription names the processes the soak runs.
func (s *soak) processDescription() string {
	d := fmt.Sprintf("%d relays and %d senders", len(s.relays), len(s.senders))
	if len(s.receivers) > 0 {
		d = fmt.Sprintf("%d relays, %d senders and %d receiver", len(s.relays), len(s.senders), len(s.receivers))
	}
	return d
}
