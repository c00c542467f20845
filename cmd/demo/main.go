// Command demo runs the whole pipeline on this machine and shows that every
// message reaches the provider exactly once, even though the provider stub
// fails some requests and withholds some responses after accepting them.
//
// It migrates the database (creating it if missing), starts the provider
// stub, a relay and two senders as separate processes (and an embedded NATS
// server with JetStream when NATS_URL is unset), enqueues N messages through
// outbox.Enqueue, shows live progress, and ends with a summary line. It exits
// non-zero if a message was delivered twice or did not finish.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/console"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/embednats"
	"github.com/sendonce/sendonce/outbox"
)

func main() { proc.Main(run) }

type config struct {
	databaseURL  string
	natsURL      string
	binDir       string
	messages     int
	senders      int
	failRate     float64
	withholdRate float64
	latency      time.Duration
	apiTimeout   time.Duration
	timeout      time.Duration
	keepLogs     bool
	consoleAddr  string
	idempotent   bool
	undelivered  string
}

func bind(s *envflag.Set, c *config) {
	s.String(&c.databaseURL, "database-url", "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/sendonce_demo?sslmode=disable", "Postgres database for the demo (created if missing)")
	s.String(&c.natsURL, "nats-url", "NATS_URL", "", "NATS server; empty runs an embedded one with JetStream")
	s.String(&c.binDir, "bin", "DEMO_BIN", "bin", "directory holding the relay, sender, receiver and smsstub binaries")
	s.Int(&c.messages, "n", "DEMO_MESSAGES", 1000, 1, 1_000_000, "messages to enqueue")
	s.Int(&c.senders, "senders", "DEMO_SENDERS", 2, 1, 32, "sender processes")
	s.Float(&c.failRate, "fail-rate", "DEMO_FAIL_RATE", 0.05, 0, 1, "share of provider requests answered 503")
	s.Float(&c.withholdRate, "withhold-rate", "DEMO_WITHHOLD_RATE", 0.02, 0, 1, "share of messages the provider accepts but never answers")
	s.Duration(&c.latency, "latency", "DEMO_LATENCY", 5*time.Millisecond, 0, time.Minute, "provider latency")
	s.Duration(&c.apiTimeout, "sms-api-timeout", "SMS_API_TIMEOUT", time.Second, 10*time.Millisecond, time.Minute, "senders' bound on one provider attempt")
	s.Duration(&c.timeout, "timeout", "DEMO_TIMEOUT", 5*time.Minute, time.Second, 24*time.Hour, "give up if the messages are not finished by then")
	s.Bool(&c.keepLogs, "keep-logs", "DEMO_KEEP_LOGS", false, "keep the processes' log directory")
	s.Bool(&c.idempotent, "idempotent", "DEMO_IDEMPOTENT", false, "the stub honours Idempotency-Key; false (the default) plays a provider without idempotency, as most are: lost answers are settled by lookups and receipts")
	s.String(&c.undelivered, "undelivered-suffixes", "DEMO_UNDELIVERED_SUFFIXES", "13,37,99", "number endings the stub reports undelivered (3% of the demo's random numbers)")
	s.String(&c.consoleAddr, "console-addr", "DEMO_CONSOLE_ADDR", "127.0.0.1:8089", "address of the operator console (relay console) the demo starts, on this host's loopback (it serves plain HTTP), a free port if taken; empty starts none. In a terminal the demo keeps it up after the summary until Ctrl-C")
	s.Check(func() error {
		if c.consoleAddr != "" && !service.LoopbackListen(c.consoleAddr) {
			return errors.New("-console-addr / DEMO_CONSOLE_ADDR must be a loopback address such as 127.0.0.1:8089: the demo's console serves plain HTTP, " +
				"and relay console refuses that elsewhere (run relay console with CONSOLE_TLS_CERT for a console other hosts reach)")
		}
		return nil
	})
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var c config
	s := envflag.New("demo", getenv, stderr)
	bind(s, &c)
	if code, stop := s.Command(args[1:]); stop {
		return code
	}
	d := &demo{cfg: c, out: stdout}
	err := d.run(ctx)
	d.cleanup()
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		if d.logDir != "" {
			fmt.Fprintf(stderr, "demo: process logs are in %s\n", d.logDir)
		}
		return 1
	}
	return 0
}

type demo struct {
	cfg    config
	out    io.Writer
	logDir string
	procs  []*proc.Process
	stop   []func()
}

func (d *demo) run(ctx context.Context) error {
	var err error
	if d.logDir, err = os.MkdirTemp("", "sendonce-demo-"); err != nil {
		return err
	}
	if err := proc.Binaries(d.cfg.binDir, "relay", "sender", "receiver", "smsstub"); err != nil {
		return err
	}

	natsURL := d.cfg.natsURL
	if natsURL == "" {
		srv, err := embednats.Start(embednats.Config{StoreDir: filepath.Join(d.logDir, "jetstream")})
		if err != nil {
			return err
		}
		d.stop = append(d.stop, func() { srv.Shutdown(); srv.WaitForShutdown() })
		natsURL = srv.ClientURL()
		fmt.Fprintf(d.out, "nats:     embedded JetStream server at %s\n", natsURL)
	} else {
		fmt.Fprintf(d.out, "nats:     %s\n", natsURL)
	}

	env := []string{"DATABASE_URL=" + d.cfg.databaseURL, "NATS_URL=" + natsURL, "LOG_FORMAT=json", "HTTP_ADDR=127.0.0.1:0"}
	if _, err := proc.Run(ctx, filepath.Join(d.cfg.binDir, "relay"), []string{"migrate"}, env); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "database: migrated %s\n", redact(d.cfg.databaseURL))

	apiKey := "demo-" + uuid.NewString()
	// The receipts' secret, shared by the stub (which signs) and the
	// receiver (which verifies).
	secret := "demo-" + uuid.NewString()
	stubURL, err := d.startStub(ctx, apiKey, secret)
	if err != nil {
		return err
	}
	kind := "with idempotency keys"
	if !d.cfg.idempotent {
		kind = "without idempotency (like Twilio)"
	}
	fmt.Fprintf(d.out, "provider: stub at %s, %s (503 for %.0f%% of requests, %.0f%% of messages accepted but never answered, %s latency; receipts signed, numbers ending %s undelivered)\n",
		stubURL, kind, 100*d.cfg.failRate, 100*d.cfg.withholdRate, d.cfg.latency, d.cfg.undelivered)
	rp, err := d.start("receiver", "receiver", nil, append(env[:len(env):len(env)], "RECEIPTS_ADDR=127.0.0.1:0", "SMS_WEBHOOK_SECRET="+secret))
	if err != nil {
		return err
	}
	receiverURL, err := rp.Announced(ctx, "receiver listening on ", 30*time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "receiver: delivery receipts at %s/v1/receipts/generic\n", receiverURL)

	if _, err := d.start("relay", "relay", nil, env); err != nil {
		return err
	}
	senderEnv := append(env[:len(env):len(env)], "SMS_API_BASE="+stubURL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY="+apiKey,
		"SMS_API_TIMEOUT="+d.cfg.apiTimeout.String(), "RETRY_BASE=100ms", "RETRY_CAP=2s", "RECEIPTS_PUBLIC_URL="+receiverURL,
		"RECEIPTS_ALLOW_INSECURE=true", // the local receiver, over http
		fmt.Sprintf("SMS_API_IDEMPOTENT=%t", d.cfg.idempotent), "SMS_API_LOOKUP=true", "SMS_API_LOOKUP_SETTLE=1s")
	for i := range d.cfg.senders {
		if _, err := d.start(fmt.Sprintf("sender-%d", i+1), "sender", nil, senderEnv); err != nil {
			return err
		}
	}
	fmt.Fprintf(d.out, "started:  1 relay, %d senders, 1 receiver (logs in %s)\n", d.cfg.senders, d.logDir)
	consoleURL, err := d.startConsole(ctx, env)
	if err != nil {
		return err
	}

	pool, err := pgxpool.New(ctx, d.cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	start := time.Now()
	ids, err := enqueue(ctx, pool, d.cfg.messages)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "enqueued: %d messages through outbox.Enqueue in %s\n", len(ids), time.Since(start).Round(time.Millisecond))

	counts, err := d.progress(ctx, pool, ids, start)
	wall := time.Since(start)
	if err != nil {
		return err
	}
	if err := d.summary(ctx, pool, ids, counts, stubURL, wall); err != nil {
		return err
	}
	if err := d.intents(ctx, pool, stubURL, receiverURL); err != nil {
		return err
	}
	if consoleURL != "" && d.terminal() {
		fmt.Fprintf(d.out, "console:  still serving at %s; Ctrl-C to stop\n", consoleURL)
		<-ctx.Done()
	}
	return nil
}

// startConsole starts relay console with a users file holding one
// operator with a fresh password, and prints its address and the login.
func (d *demo) startConsole(ctx context.Context, env []string) (string, error) {
	if d.cfg.consoleAddr == "" {
		return "", nil
	}
	password := strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	line, err := console.UserLine("demo", console.RoleOperator, password)
	if err != nil {
		return "", err
	}
	users := filepath.Join(d.logDir, "console-users")
	if err := os.WriteFile(users, []byte("# the demo's operator\n"+line+"\n"), 0o600); err != nil {
		return "", err
	}
	var url string
	for _, addr := range []string{d.cfg.consoleAddr, "127.0.0.1:0"} {
		p, err := d.start("console", "relay", []string{"console"}, append(env[:len(env):len(env)], "CONSOLE_ADDR="+addr, "CONSOLE_USERS_FILE="+users))
		if err != nil {
			return "", err
		}
		if url, err = p.Announced(ctx, console.Announcement, 30*time.Second); err == nil {
			break
		}
		// The address was taken: this one has exited, try a free port.
		p.Stop(syscall.SIGTERM, 5*time.Second)
		d.procs = slices.DeleteFunc(d.procs, func(q *proc.Process) bool { return q == p })
	}
	if url == "" {
		return "", fmt.Errorf("the console did not start (see %s)", filepath.Join(d.logDir, "console.log"))
	}
	fmt.Fprintf(d.out, "console:  %s  (log in as demo, password %s)\n", url, password)
	return url, nil
}

// enqueue writes n messages the way an application would: inside its own
// transactions, 50 per commit.
func enqueue(ctx context.Context, pool *pgxpool.Pool, n int) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, n)
	for len(ids) < n {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := 0; i < 50 && len(ids) < n; i++ {
				to := fmt.Sprintf("+1555%07d", rand.IntN(10_000_000))
				body := fmt.Sprintf("Your sendonce demo code is %06d", rand.IntN(1_000_000))
				id, err := outbox.Enqueue(ctx, tx, to, body)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("enqueue: %w", err)
		}
	}
	return ids, nil
}

func (d *demo) progress(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, start time.Time) (map[string]int, error) {
	deadline := time.Now().Add(d.cfg.timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	// Once every message is finished, the receipts of those still sent
	// are waited for a while: a receipt the provider never sends must not
	// hold the demo up.
	var doneAt time.Time
	for {
		counts, err := statusCounts(ctx, pool, ids)
		if err != nil {
			return nil, err
		}
		finished := counts["sent"] + counts["delivered"] + counts["undelivered"] + counts["dead"] + counts["unknown"]
		fmt.Fprintf(d.out, d.lineStart()+"progress: %6.1fs  pending %-6d queued %-6d sending %-6d sent %-6d delivered %-6d undelivered %-4d dead %-4d unknown %-4d",
			time.Since(start).Seconds(), counts["pending"], counts["queued"], counts["sending"], counts["sent"], counts["delivered"],
			counts["undelivered"], counts["dead"], counts["unknown"])
		if !d.terminal() {
			fmt.Fprintln(d.out)
		}
		if finished == len(ids) && doneAt.IsZero() {
			doneAt = time.Now()
		}
		if finished == len(ids) && (counts["sent"] == 0 || time.Since(doneAt) > 15*time.Second) {
			if d.terminal() {
				fmt.Fprintln(d.out)
			}
			return counts, nil
		}
		for _, p := range d.procs {
			if p.Exited() {
				return nil, fmt.Errorf("%s exited early: %s", p.Name(), p.Status())
			}
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(d.out)
			return nil, fmt.Errorf("%d of %d messages not finished after %s", len(ids)-finished, len(ids), d.cfg.timeout)
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(d.out)
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// terminal reports whether progress can redraw one line in place.
func (d *demo) terminal() bool {
	f, ok := d.out.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (d *demo) lineStart() string {
	if d.terminal() {
		return "\r"
	}
	return ""
}

func statusCounts(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID) (map[string]int, error) {
	rows, _ := pool.Query(ctx, `SELECT status, count(*) FROM sms_outbox WHERE id = ANY($1) GROUP BY status`, ids)
	counts := map[string]int{}
	var st string
	var n int
	_, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { counts[st] = n; return nil })
	return counts, err
}

func (d *demo) summary(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, counts map[string]int, stubURL string, wall time.Duration) error {
	var p50, p99 float64
	var attempts int
	// Commit to the provider's acceptance, as written: the sender's sent
	// write, the lookup that found the message, or a receipt that came
	// first (sent_at).
	err := pool.QueryRow(ctx, `WITH taken AS (
			SELECT o.id, o.sent_at - o.created_at AS took
			FROM sms_outbox o
			WHERE o.id = ANY($1) AND o.sent_at IS NOT NULL)
		SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM took)), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM took)), 0),
		       (SELECT coalesce(sum(attempt_count), 0) FROM sms_outbox WHERE id = ANY($1))
		FROM taken`, ids).Scan(&p50, &p99, &attempts)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	// Rows an attempt of which got no answer: without evidence each would
	// have ended unknown.
	var settled, receipts, lookups int
	err = pool.QueryRow(ctx, `SELECT
			(SELECT count(DISTINCT a.outbox_id) FROM sms_attempts a JOIN sms_outbox o ON o.id = a.outbox_id
			 WHERE a.outbox_id = ANY($1) AND a.outcome = 'ambiguous' AND o.status IN ('sent', 'delivered', 'undelivered', 'dead')),
			(SELECT count(*) FROM sms_evidence WHERE outbox_id = ANY($1) AND kind = 'receipt'),
			(SELECT count(*) FROM sms_evidence WHERE outbox_id = ANY($1) AND kind = 'lookup')`, ids).Scan(&settled, &receipts, &lookups)
	if err != nil {
		return fmt.Errorf("evidence: %w", err)
	}
	deliveries, err := smsstub.FetchDeliveries(ctx, stubURL)
	if err != nil {
		return err
	}
	stats, err := smsstub.FetchStats(ctx, stubURL)
	if err != nil {
		return err
	}
	perKey := map[int]int{}
	dups := 0
	for _, id := range ids {
		n := deliveries[id.String()].Deliveries
		perKey[n]++
		if n > 1 {
			dups++
		}
	}
	perKeyText := "all 1"
	if perKey[1] != len(ids) {
		perKeyText = fmt.Sprintf("%d keys with 1, %d with 0, %d with more", perKey[1], perKey[0], dups)
	}
	fmt.Fprintf(d.out, "provider: %d requests, %d injected 503s, %d responses withheld after accepting, %d replays of a stored answer, %d lookups, %d receipts sent\n",
		stats.Requests, stats.Failures, stats.Withheld, stats.Replays, stats.Lookups, stats.ReceiptsSent)
	taken := counts["sent"] + counts["delivered"] + counts["undelivered"]
	fmt.Fprintf(d.out, "summary:  %d messages: delivered %d, undelivered %d, sent (no receipt yet) %d, dead %d, unknown %d; unknown settled by evidence: %d (%d receipts, %d lookups recorded); deliveries at the provider per key: %s (duplicates %d); attempts %d; commit-to-accepted p50 %s p99 %s; wall %s\n",
		len(ids), counts["delivered"], counts["undelivered"], counts["sent"], counts["dead"], counts["unknown"], settled, receipts, lookups,
		perKeyText, dups, attempts, secs(p50), secs(p99), wall.Round(time.Millisecond))
	fmt.Fprint(d.out, countsLegend)
	if dups > 0 {
		return fmt.Errorf("%d messages were delivered more than once", dups)
	}
	if taken != perKey[1] {
		return fmt.Errorf("%d rows taken by the provider but %d keys delivered once", taken, perKey[1])
	}
	return nil
}

// countsLegend says what each count of the provider and summary lines
// means, for a reader who does not know the words yet.
const countsLegend = `what the counts mean:
  injected 503s                 requests the stub failed on purpose; the senders tried them again
  responses withheld            requests the stub took and then never answered: the message reached it,
                                and the sender could not know (the failure this exists for)
  replays of a stored answer    requests the stub answered again from the key it had seen (a provider with
                                idempotency, DEMO_IDEMPOTENT=true); 0 when it plays one without
  lookups                       "do you have this message?" asked of the provider before sending again
                                after an answer was lost
  receipts sent / recorded      delivery reports the stub posted / the receiver recorded; one posted twice
                                or saying nothing new is recorded once
  unknown settled by evidence   messages whose answer was lost, settled by a receipt or a lookup
                                instead of being sent again
  deliveries per key            how many times the provider took each message: 1 is exactly once
  attempts                      send attempts the rows counted (a lookup spends none)
  commit-to-accepted            from the application's commit to the provider's acceptance
`

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Microsecond).String()
}

// startStub starts the provider stub on a free port and returns its URL,
// read from the line it prints once listening.
func (d *demo) startStub(ctx context.Context, apiKey, secret string) (string, error) {
	args := []string{"-addr", "127.0.0.1:0",
		"-fail-rate", fmt.Sprint(d.cfg.failRate), "-fail-status", "503",
		"-withhold-rate", fmt.Sprint(d.cfg.withholdRate), "-latency", d.cfg.latency.String(),
		"-ignore-keys=" + fmt.Sprint(!d.cfg.idempotent), "-undelivered-suffixes", d.cfg.undelivered,
		"-receipt-delay", "200ms", "-receipt-jitter", "1s", "-receipt-duplicate-rate", "0.05", "-receipt-reorder-rate", "0.05"}
	p, err := d.start("smsstub", "smsstub", args, []string{"SMS_API_KEY=" + apiKey, "SMS_WEBHOOK_SECRET=" + secret})
	if err != nil {
		return "", err
	}
	return p.Announced(ctx, smsstub.Announcement, 10*time.Second)
}

// start starts a binary with its output in the log directory.
func (d *demo) start(name, bin string, args, env []string) (*proc.Process, error) {
	p, err := proc.Start(proc.Spec{Name: name, Path: filepath.Join(d.cfg.binDir, bin), Args: args, Env: env,
		LogFile: filepath.Join(d.logDir, name+".log")})
	if err != nil {
		return nil, err
	}
	d.procs = append(d.procs, p)
	return p, nil
}

// cleanup stops the processes with SIGTERM (they drain and exit 0), then the
// embedded server.
func (d *demo) cleanup() {
	proc.StopAll(30*time.Second, d.procs...)
	for _, f := range d.stop {
		f()
	}
	if d.logDir != "" && !d.cfg.keepLogs {
		_ = os.RemoveAll(d.logDir)
		d.logDir = ""
	}
}

func redact(dsn string) string {
	if i := strings.Index(dsn, "@"); i >= 0 {
		if j := strings.Index(dsn, "://"); j >= 0 && j < i {
			return dsn[:j+3] + "…" + dsn[i:]
		}
	}
	return dsn
}
