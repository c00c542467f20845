// Command relay moves committed sms_outbox rows into the JetStream stream SMS,
// and applies the database migrations.
//
//	relay [flags]               run until SIGINT or SIGTERM
//	relay migrate [-down N]     apply (or revert N) migrations, then exit
//
// Every flag has an environment variable; run "relay -h" for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type config struct {
	databaseURL   string
	nats          natsconn.Config
	ensureTopo    bool
	httpAddr      string
	logFormat     string
	logLevel      string
	batchSize     int
	workers       int
	publishWindow int
	pollInterval  time.Duration
	ackTimeout    time.Duration
	dbTimeout     time.Duration
	shutdown      time.Duration
	reconcile     bool
	reconcileInt  time.Duration
	reconcileAge  time.Duration
	retention     time.Duration
	retentionInt  time.Duration
}

func bind(s *envflag.Set, c *config) {
	s.Secret(&c.databaseURL, "database-url", "DATABASE_URL", "Postgres URL of the database holding sms_outbox (may hold a password)")
	s.Required(&c.databaseURL, "database-url")
	natsconn.Bind(s, &c.nats)
	s.Bool(&c.ensureTopo, "nats-ensure-topology", "NATS_ENSURE_TOPOLOGY", true, "create or update the streams and consumer of nats/ at start-up; false only checks they exist (for credentials without those permissions)")
	s.String(&c.httpAddr, "http-addr", "HTTP_ADDR", ":9101", "address for /metrics, /healthz and /readyz; empty disables")
	s.Enum(&c.logFormat, "log-format", "LOG_FORMAT", "json", []string{"json", "text"}, "log format")
	s.Enum(&c.logLevel, "log-level", "LOG_LEVEL", "info", []string{"debug", "info", "warn", "error"}, "log level")
	s.Int(&c.batchSize, "batch-size", "RELAY_BATCH_SIZE", 500, 1, 10000, "rows claimed per transaction")
	s.Int(&c.workers, "workers", "RELAY_WORKERS", 2, 1, 64, "batches in flight at once, each in its own transaction")
	s.Int(&c.publishWindow, "publish-window", "RELAY_PUBLISH_WINDOW", 1024, 1, 65536, "publications awaiting their PubAck at once")
	s.Duration(&c.pollInterval, "poll-interval", "RELAY_POLL_INTERVAL", time.Second, 10*time.Millisecond, time.Hour, "how often to look for rows without a notification")
	s.Duration(&c.ackTimeout, "ack-timeout", "RELAY_ACK_TIMEOUT", 10*time.Second, 100*time.Millisecond, 10*time.Minute, "how long to wait for a batch's PubAcks")
	s.Duration(&c.dbTimeout, "db-timeout", "DB_TIMEOUT", 10*time.Second, 100*time.Millisecond, 10*time.Minute, "bound on each database round trip")
	s.Duration(&c.shutdown, "shutdown-timeout", "SHUTDOWN_TIMEOUT", 30*time.Second, time.Second, time.Hour, "bound on a graceful shutdown")
	s.Bool(&c.reconcile, "reconcile", "RECONCILE", true, "run the reconciler, which republishes or finalises rows stuck in queued or sending")
	s.Duration(&c.reconcileInt, "reconcile-interval", "RECONCILE_INTERVAL", 30*time.Second, 10*time.Millisecond, time.Hour, "time between reconciler passes")
	s.Duration(&c.retention, "outbox-retention", "OUTBOX_RETENTION", 7*24*time.Hour, 0, 10*365*24*time.Hour, "keep finished rows (and their attempts) this long after their last change; 0 keeps them forever")
	s.Duration(&c.retentionInt, "retention-interval", "RETENTION_INTERVAL", time.Minute, 10*time.Millisecond, 24*time.Hour, "time between retention purges")
	s.Duration(&c.reconcileAge, "reconcile-grace", "RECONCILE_GRACE", 2*time.Minute, time.Millisecond, 24*time.Hour, "how long past its retry time a queued row, or past the end of its claim's lease a sending row, waits before it counts as stuck; must exceed the consumer's AckWait (each claim's lease is stamped in its row, so the senders' SENDER_LEASE need not be known here)")
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	sub := ""
	if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		sub = args[1]
	}
	switch sub {
	case "":
	case "migrate":
	case "dlq", "trace":
		return runOps(ctx, sub, args[2:], getenv, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "relay: unknown command %q (want migrate, dlq or trace)\n", sub)
		return 2
	}
	migrateMode := sub == "migrate"
	flagArgs := args[1:]
	name := "relay"
	if migrateMode {
		flagArgs = args[2:]
		name = "relay migrate"
	}
	var c config
	s := envflag.New(name, getenv, stderr)
	bind(s, &c)
	down := 0
	if migrateMode {
		s.FlagSet().IntVar(&down, "down", 0, "revert this many migrations instead of applying")
	}
	if err := s.Parse(flagArgs); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "%s: configuration: %v\n", name, err)
		return 2
	}
	root, err := telemetry.NewLogger(stderr, c.logFormat, c.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	// The packages name their own component (relay, reconciler, retention,
	// sender) on root; this logger is for the command's own lines.
	log := root.With("component", "relay")
	if migrateMode {
		if err := runMigrate(ctx, c, down, log); err != nil {
			log.Error("migrate failed", "err", err)
			return 1
		}
		return 0
	}
	if err := runRelay(ctx, c, root, log); err != nil {
		log.Error("relay failed", "err", err)
		return 1
	}
	return 0
}

func runMigrate(ctx context.Context, c config, down int, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	conn, created, err := migrate.EnsureDatabase(ctx, c.databaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if created {
		log.Info("created database", "database", conn.Config().Database)
	}
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		return err
	}
	if down > 0 {
		v, err := migrate.Down(ctx, conn, migs, down)
		log.Info("migrations reverted", "versions", v)
		return err
	}
	v, err := migrate.Up(ctx, conn, migs)
	log.Info("migrations applied", "versions", v, "latest", migs[len(migs)-1].Version)
	return err
}

// root goes to the packages, which name their component on it; log is
// the command's own.
func runRelay(ctx context.Context, c config, root, log *slog.Logger) error {
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	poolCfg, err := outbox.PoolConfig(c.databaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	// A connection per worker, plus the reconciler, retention, the depth
	// gauges and /readyz (the LISTEN connection is its own).
	poolCfg.MaxConns = max(poolCfg.MaxConns, int32(c.workers)+4)
	pool, err := pgxpool.NewWithConfig(startCtx, poolCfg)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(startCtx); err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	natsCfg := withConn(c.nats, "sendonce-relay", c.publishWindow, log)
	natsCfg.PublishAckTimeout = c.ackTimeout
	nc, js, err := natsconn.Connect(natsCfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	topo, err := streams.Default()
	if err != nil {
		return err
	}
	if c.ensureTopo {
		changed, err := topo.Ensure(startCtx, js)
		if err != nil {
			return err
		}
		for _, c := range changed {
			log.Info("nats topology", "change", c)
		}
	} else if err := topo.Check(startCtx, js); err != nil {
		return fmt.Errorf("NATS_ENSURE_TOPOLOGY=false: %w", err)
	}
	if err := checkRetention(c.retention, topo); err != nil {
		return err
	}

	reg := telemetry.NewRegistry()
	r, err := relay.New(relay.Config{
		Pool: pool, JetStream: js, BatchSize: c.batchSize, Workers: c.workers, PublishWindow: c.publishWindow,
		PollInterval: c.pollInterval, AckTimeout: c.ackTimeout, DBTimeout: c.dbTimeout,
		Logger: root, Registerer: reg,
	})
	if err != nil {
		return err
	}
	if c.httpAddr != "" {
		stopHTTP, err := telemetry.Start(c.httpAddr, reg, func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return fmt.Errorf("postgres: %w", err)
			}
			return topo.Check(ctx, js)
		}, log)
		if err != nil {
			return fmt.Errorf("HTTP_ADDR: %w", err)
		}
		defer stopHTTP()
	}
	var rec *relay.Reconciler
	if c.reconcile {
		rec, err = relay.NewReconciler(relay.ReconcilerConfig{
			Pool: pool, JetStream: js, Interval: c.reconcileInt, Grace: c.reconcileAge,
			DBTimeout: c.dbTimeout, Logger: root, Registerer: reg,
		})
		if err != nil {
			return err
		}
		if err := rec.CheckGrace(startCtx); err != nil {
			return fmt.Errorf("RECONCILE_GRACE: %w", err)
		}
	}
	runs := []func(context.Context) error{r.Run}
	if rec != nil {
		runs = append(runs, rec.Run)
	}
	if c.retention > 0 {
		ret, err := relay.NewRetention(relay.RetentionConfig{
			Pool: pool, Age: c.retention, Interval: c.retentionInt, DBTimeout: c.dbTimeout, Logger: root, Registerer: reg,
		})
		if err != nil {
			return err
		}
		runs = append(runs, ret.Run)
	}
	reg.MustRegister(relay.NewDepthCollector(pool, log))
	log.Info("relay started", "batch_size", c.batchSize, "workers", c.workers, "publish_window", c.publishWindow,
		"reconcile", c.reconcile, "retention", c.retention.String())

	done := make(chan error, 1)
	go func() { done <- runAll(ctx, runs) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		select {
		case err = <-done:
		case <-time.After(c.shutdown):
			return fmt.Errorf("shutdown did not finish within %s", c.shutdown)
		}
	}
	if err != nil {
		return err
	}
	if err := natsconn.Drain(nc, 5*time.Second); err != nil {
		log.Warn("nats drain", "err", err)
	}
	log.Info("relay stopped")
	return nil
}

// checkRetention refuses a row retention shorter than the work stream's
// max_age: a message (a redelivery, a republication) can live that long in
// the stream, and a row purged before it would turn its message into an
// "invalid" dead letter, and its replay impossible.
func checkRetention(retention time.Duration, topo *streams.Topology) error {
	if retention <= 0 {
		return nil
	}
	for _, sc := range topo.Streams {
		if sc.Name == streams.Stream && sc.MaxAge > retention {
			return fmt.Errorf("OUTBOX_RETENTION (%s) is shorter than the %s stream's max_age (%s): a message could outlive its row; raise it (or 0 to keep rows)", retention, sc.Name, sc.MaxAge)
		}
	}
	return nil
}

// runAll runs every fn until ctx is done and returns their errors joined,
// after all have returned.
func runAll(ctx context.Context, fns []func(context.Context) error) error {
	errs := make(chan error, len(fns))
	for _, fn := range fns {
		go func() { errs <- fn(ctx) }()
	}
	var all []error
	for range fns {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// withConn completes the bound NATS settings for this process.
func withConn(c natsconn.Config, name string, publishWindow int, log *slog.Logger) natsconn.Config {
	c.Name, c.PublishWindow, c.ConnectTimeout, c.Logger = name, publishWindow, 10*time.Second, log
	return c
}
