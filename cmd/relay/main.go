// Command relay moves committed sms_outbox rows into the JetStream stream SMS,
// and holds the commands an operator runs against the outbox.
//
//	relay [flags]                 run until SIGINT or SIGTERM
//	relay migrate [-down N]       apply (or revert N) migrations, then exit
//	relay setup                   create or update the JetStream topology, then exit
//	relay dlq list|replay ...     list or replay dead letters
//	relay trace ID                a row, its attempts and its dead letters
//	relay console                 serve the operator console on CONSOLE_ADDR
//	relay scram-verifier < PW     print a Postgres SCRAM verifier of the password on stdin
//
// Every flag has an environment variable; "relay -h" lists the settings and
// the commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/tracing"
)

func main() { proc.Main(run) }

// command is a subcommand of relay: "relay NAME ARGS".
type command struct {
	name, args, what string
	run              proc.Command
}

// commands are relay's subcommands, in the order "relay -h" lists them.
func commands() []command {
	return []command{
		{"migrate", "[-down N [-force]]", "apply the embedded migrations (or revert the last N), then exit", runMigrate},
		{"setup", "", "create or update the JetStream streams, consumers and flow bucket (admin NATS credentials), then exit", runSetup},
		{"dlq", "list|replay [flags]", "list dead letters, or put dead and unknown rows back to pending", opsCommand("dlq")},
		{"trace", "ID", "show a row (number masked), its attempts, receipts, lookups and dead letters", opsCommand("trace")},
		{"suppress", "add|remove|list|check|import", "the suppression list: numbers no provider is called for", runSuppress},
		{"resolve", "-id ID | -all [-dry-run]", "look unknown rows up at the provider and settle them", runResolve},
		{"console", "[user NAME ROLE]", "serve the operator console on CONSOLE_ADDR (or print a users-file line)", runConsole},
		{"scram-verifier", "< PASSWORD", "print the PostgreSQL SCRAM-SHA-256 verifier of the password read on stdin (deploy/postgres/logins.sh)", runScramVerifier},
	}
}

// opsCommand runs an operator command of ops.go.
func opsCommand(name string) proc.Command {
	return func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
		return runOps(ctx, name, args, getenv, stdout, stderr)
	}
}

// intro is what "relay -h" prints before the settings.
func intro() string {
	var b strings.Builder
	b.WriteString("relay moves committed sms_outbox rows into JetStream, until SIGINT or SIGTERM.\n\nUsage:\n")
	fmt.Fprintf(&b, "  %-32s %s\n", "relay [flags]", "run the relay")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-32s %s\n", "relay "+c.name+" "+c.args, c.what)
	}
	b.WriteString(`"relay COMMAND -h" lists a command's settings.`)
	return b.String()
}

type config struct {
	service.Settings
	// tracing is the process's traces (OTEL_*); nil when off.
	tracing       *tracing.Tracing
	directURL     string
	pollAlone     time.Duration
	timeInterval  time.Duration
	batchSize     int
	workers       int
	publishWindow int
	pollInterval  time.Duration
	linger        time.Duration
	ackTimeout    time.Duration
	reconcile     bool
	reconcileInt  time.Duration
	reconcileAge  time.Duration
	retention     time.Duration
	retentionInt  time.Duration
}

func bind(s *envflag.Set, c *config) {
	service.Bind(s, &c.Settings, "127.0.0.1:9101")
	s.Group("relay: batches, polling, the reconciler, retention")
	s.Int(&c.batchSize, "batch-size", "RELAY_BATCH_SIZE", relay.DefaultBatchSize, 1, 10000, "rows claimed per transaction")
	s.Int(&c.workers, "workers", "RELAY_WORKERS", relay.DefaultWorkers, 1, 64, "batches in flight at once, each in its own transaction")
	s.Int(&c.publishWindow, "publish-window", "RELAY_PUBLISH_WINDOW", relay.DefaultPublishWindow, 1, 65536, "publications awaiting their PubAck at once")
	service.BindDirectURL(s, &c.directURL)
	s.Duration(&c.pollInterval, "poll-interval", "RELAY_POLL_INTERVAL", relay.DefaultPollInterval, 10*time.Millisecond, time.Hour, "how often to look for rows without a notification, while the LISTEN works")
	s.Duration(&c.timeInterval, "time-interval", "RELAY_TIME_INTERVAL", relay.DefaultTimeInterval, 10*time.Millisecond, time.Minute, "how often to make due scheduled rows (send_at) pending and end rows past their expiry (expires_at) that no sender holds: a scheduled message is published at most about this long after its send time")
	s.Duration(&c.pollAlone, "poll-alone", "RELAY_POLL_ALONE", relay.DefaultPollAlone, 10*time.Millisecond, time.Hour, "how often to look for rows while no LISTEN wakes the relay (through a transaction pooler without DATABASE_DIRECT_URL, a LISTEN that hears nothing, its connection lost): a row waits about half of it")
	s.Duration(&c.linger, "linger", "RELAY_LINGER", relay.DefaultLinger, 0, time.Second, "how long notifications gather before the batch they start (0: a batch per notification)")
	s.Duration(&c.ackTimeout, "ack-timeout", "RELAY_ACK_TIMEOUT", relay.DefaultAckTimeout, 100*time.Millisecond, 10*time.Minute, "how long to wait for a batch's PubAcks; rows not acknowledged stay pending")
	s.Bool(&c.reconcile, "reconcile", "RECONCILE", true, "run the reconciler, which republishes or finalises rows stuck in queued or sending")
	s.Duration(&c.reconcileInt, "reconcile-interval", "RECONCILE_INTERVAL", 30*time.Second, 10*time.Millisecond, time.Hour, "time between reconciler passes")
	s.Duration(&c.reconcileAge, "reconcile-grace", "RECONCILE_GRACE", 2*time.Minute, time.Millisecond, 24*time.Hour, "how long past its retry time a queued row, or past the end of its claim's lease a sending row, waits before it counts as stuck; must exceed the consumer's AckWait (each claim's lease is stamped in its row, so the senders' SENDER_LEASE need not be known here)")
	s.Duration(&c.retention, "outbox-retention", "OUTBOX_RETENTION", relay.DefaultRetentionAge, 0, 10*365*24*time.Hour, "keep finished rows (sent, dead; never unknown, which wait for a person) and their attempts this long after their last change; by default as long as SMS_DLQ keeps dead letters; 0 keeps them forever")
	s.Duration(&c.retentionInt, "retention-interval", "RETENTION_INTERVAL", relay.DefaultRetentionInterval, 10*time.Millisecond, 24*time.Hour, "time between retention purges")
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		var names []string
		for _, c := range commands() {
			if c.name == args[1] {
				return c.run(ctx, args[2:], getenv, stdout, stderr)
			}
			names = append(names, c.name)
		}
		fmt.Fprintf(stderr, "relay: unknown command %q (want %s; relay -h lists them)\n", args[1], strings.Join(names, ", "))
		return 2
	}
	var c config
	s := envflag.New("relay", getenv, stderr)
	s.Intro(intro())
	bind(s, &c)
	root, code := service.Parse("relay", s, args[1:], &c.Settings, stderr)
	if root == nil {
		return code
	}
	// The packages name their own component (relay, reconciler, retention)
	// on root; this logger is for the command's own lines.
	log := root.With("component", "relay")
	return service.RunTraced(ctx, "sendonce-relay", "relay", getenv, log, func(tr *tracing.Tracing) error {
		c.tracing = tr
		return runRelay(ctx, c, root, log)
	})
}

// runMigrate is "relay migrate": it needs only the database.
func runMigrate(ctx context.Context, args []string, getenv func(string) string, _, stderr io.Writer) int {
	var c migrateConfig
	s := envflag.New("relay migrate", getenv, stderr)
	bindMigrate(s, &c)
	root, code := service.Parse("relay migrate", s, args, &c.Settings, stderr)
	if root == nil {
		return code
	}
	log := root.With("component", "relay")
	if err := migrateDB(ctx, c, root); err != nil {
		log.Error("migrate failed", "err", err)
		return 1
	}
	return 0
}

// migrateConfig is what relay migrate needs: the database, the logs, and
// how to migrate.
type migrateConfig struct {
	service.Settings
	directURL   string
	down        int
	force       bool
	lockTimeout time.Duration
}

func bindMigrate(s *envflag.Set, c *migrateConfig) {
	s.Intro("relay migrate applies the embedded migrations (creating the database if it is missing; safe when several run at once), then exits.")
	service.BindDatabase(s, &c.Database)
	service.BindDirectURL(s, &c.directURL)
	s.Enum(&c.LogFormat, "log-format", "LOG_FORMAT", "json", []string{"json", "text"}, "log format")
	s.Enum(&c.LogLevel, "log-level", "LOG_LEVEL", "info", []string{"debug", "info", "warn", "error"}, "log level")
	s.FlagSet().IntVar(&c.down, "down", 0, "revert this many migrations instead of applying (refused while sms_outbox holds rows: roll back binaries, not schema)")
	s.FlagSet().BoolVar(&c.force, "force", false, "with -down: revert even though sms_outbox holds rows (destroys data)")
	s.FlagSet().DurationVar(&c.lockTimeout, "lock-timeout", migrate.DefaultLockTimeout, "longest a migration statement waits for a table lock (and so the longest an application's insert waits behind it); the migration is tried again after")
}

// migrateDB applies (or reverts) the migrations. Nothing bounds the whole
// run: building an index or validating a constraint on a large table takes
// as long as it takes while writes go on; SIGTERM stops it.
func migrateDB(ctx context.Context, c migrateConfig, root *slog.Logger) error {
	log := root.With("component", "relay")
	connCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// Migrations hold a session's advisory lock and session settings: a
	// transaction pooler would hand their statements to other sessions.
	db, ok := c.Database.Session(c.directURL)
	if !ok {
		return errors.New("DATABASE_POOLER=transaction: relay migrate needs a session of its own; set DATABASE_DIRECT_URL to the database past the pooler (docs/operations.md, behind a connection pooler)")
	}
	setting := "DATABASE_URL"
	if c.directURL != "" {
		setting = "DATABASE_DIRECT_URL"
	}
	conn, created, err := migrate.EnsureDatabase(connCtx, db.URL)
	if err != nil {
		return fmt.Errorf("%s: %w", setting, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if created {
		log.Info("created database", "database", conn.Config().Database)
	}
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		return err
	}
	m, err := migrate.New(migrate.Config{LockTimeout: c.lockTimeout, Force: c.force, Logger: root})
	if err != nil {
		return fmt.Errorf("-lock-timeout: %w", err)
	}
	if c.down > 0 {
		v, err := m.Down(ctx, conn, migs, c.down)
		log.Info("migrations reverted", "versions", v)
		return err
	}
	v, err := m.Up(ctx, conn, migs)
	log.Info("migrations applied", "versions", v, "latest", migs[len(migs)-1].Version)
	return err
}

// root goes to the packages, which name their component on it; log is
// the command's own.
func runRelay(ctx context.Context, c config, root, log *slog.Logger) error {
	tel, err := service.StartTelemetry(c.HTTPAddr, log)
	if err != nil {
		return err
	}
	defer tel.Stop()
	conns, err := service.Open(ctx, c.Settings, service.Options{
		Telemetry: tel, Name: "sendonce-relay", PublishWindow: c.publishWindow, PublishAckTimeout: c.ackTimeout,
		// A connection per worker, plus the reconciler, retention, the
		// monitor and the dependency gauge (the LISTEN connection is its own).
		MinConns: int32(c.workers) + 4,
		// Each batch's queued write is planned once per connection
		// rather than once per batch, once the table is large.
		GenericPlans: true,
	}, log)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("relay stopped before it started", "err", err)
			return nil
		}
		return err
	}
	defer conns.Close()
	startCtx, cancel := context.WithTimeout(ctx, service.StartTimeout)
	defer cancel()
	if err := checkRetention(c.retention, conns.Topology); err != nil {
		return err
	}

	reg := tel.Registry
	reg.MustRegister(conns.Keeper)
	var listen *pgx.ConnConfig
	session, listens := c.Database.Session(c.directURL)
	noListen := !listens
	if listens && c.directURL != "" {
		if listen, err = outbox.ConnConfig(session.URL, session.Pooler); err != nil {
			return fmt.Errorf("DATABASE_DIRECT_URL: %w", err)
		}
	}
	r, err := relay.New(relay.Config{
		Pool: conns.Pool, JetStream: conns.JS, BatchSize: c.batchSize, Workers: c.workers, PublishWindow: c.publishWindow,
		PollInterval: c.pollInterval, PollAlone: c.pollAlone, TimeInterval: c.timeInterval, Linger: lingerSetting(c.linger), AckTimeout: c.ackTimeout,
		DBTimeout: c.DBTimeout, Listen: listen, NoListen: noListen, Logger: root, Registerer: reg, Tracing: c.tracing,
	})
	if err != nil {
		return err
	}
	if err := r.CheckDuplicateWindow(startCtx); err != nil {
		log.Warn("duplicate window shorter than the relay's republication horizon: a failed batch's rows may reach the senders twice (their claim still stops a second send)", "err", err)
	}
	loops := []func(context.Context) error{r.Run}
	if c.reconcile {
		rec, err := relay.NewReconciler(relay.ReconcilerConfig{
			Pool: conns.Pool, JetStream: conns.JS, Interval: c.reconcileInt, Grace: c.reconcileAge,
			DBTimeout: c.DBTimeout, Logger: root, Registerer: reg, Tracing: c.tracing,
		})
		if err != nil {
			return err
		}
		if err := rec.CheckGrace(startCtx); err != nil {
			return fmt.Errorf("RECONCILE_GRACE: %w", err)
		}
		loops = append(loops, rec.Run)
	}
	if c.retention > 0 {
		ret, err := relay.NewRetention(relay.RetentionConfig{
			Pool: conns.Pool, Age: c.retention, Interval: c.retentionInt, DBTimeout: c.DBTimeout, Logger: root, Registerer: reg,
		})
		if err != nil {
			return err
		}
		loops = append(loops, ret.Run)
	}
	mon, err := relay.NewMonitor(relay.MonitorConfig{Pool: conns.Pool, JetStream: conns.JS, Logger: root, Registerer: reg})
	if err != nil {
		return err
	}
	loops = append(loops, mon.Run)
	// Ready from local state only: the NATS connection and the relay's
	// own batches (which touch Postgres and NATS every poll interval).
	tel.SetReady(r.Ready)
	log.Info("relay started", "batch_size", c.batchSize, "workers", c.workers, "publish_window", c.publishWindow,
		"reconcile", c.reconcile, "retention", c.retention.String())
	if err := conns.Run(ctx, c.ShutdownTimeout, log, loops...); err != nil {
		return err
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

// withConn completes the bound NATS settings for an operator command.
func withConn(c natsconn.Config, name string, publishWindow int, log *slog.Logger) natsconn.Config {
	return service.NATSConfig(c, service.Options{Name: name, PublishWindow: publishWindow}, log)
}

// lingerSetting maps RELAY_LINGER to relay.Config.Linger, where zero means
// the default: a setting of 0 asks for a batch at each notification.
func lingerSetting(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
