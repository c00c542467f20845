// Package service holds what the long-running binaries, the relay and the
// sender, do the same way: the settings they share, their connections to
// Postgres and NATS with the JetStream topology ensured, the telemetry
// endpoint, and running their loops until SIGTERM within a shutdown bound.
// A binary's main binds its own settings beside these, builds its
// components on the connections and hands their Run methods to Run.
package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/sendonce/sendonce/internal/build"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/telemetry"
	"github.com/sendonce/sendonce/internal/tracing"
)

// DefaultShutdownTimeout bounds a graceful shutdown (SHUTDOWN_TIMEOUT).
const DefaultShutdownTimeout = 30 * time.Second

// Settings are the settings every service has.
type Settings struct {
	// Database is how to reach Postgres (DATABASE_URL, DATABASE_POOLER).
	Database Database
	// NATS is how to reach NATS (NATS_URL and the auth settings).
	NATS natsconn.Config
	// Topology is NATS_ENSURE_TOPOLOGY and NATS_REPLICAS.
	Topology streams.Settings
	// HTTPAddr serves /metrics, /healthz and /readyz; empty disables it.
	HTTPAddr string
	// LogFormat is json or text; LogLevel debug, info, warn or error.
	LogFormat, LogLevel string
	// DBTimeout bounds each database round trip.
	DBTimeout time.Duration
	// ShutdownTimeout bounds a graceful shutdown.
	ShutdownTimeout time.Duration
}

// BindConnections binds the settings a service needs to reach Postgres and
// NATS; operator commands bind only these.
func BindConnections(s *envflag.Set, c *Settings) {
	BindDatabase(s, &c.Database)
	natsconn.Bind(s, &c.NATS)
}

// BindHTTPAddr binds HTTP_ADDR, the address of /metrics, /healthz and
// /readyz, with def (a loopback address) as its default.
func BindHTTPAddr(s *envflag.Set, addr *string, def string) {
	s.String(addr, "http-addr", "HTTP_ADDR", def, "address for /metrics, /healthz and /readyz (this host only by default; \":PORT\" serves every interface, for a scraper or probe on another host); empty disables")
}

// Bind binds every shared setting; httpAddr is the default of HTTP_ADDR, a
// loopback address whose port differs between the binaries so they can
// share a host.
func Bind(s *envflag.Set, c *Settings, httpAddr string) {
	BindConnections(s, c)
	streams.Bind(s, &c.Topology)
	s.Group("health, logs and timeouts")
	BindHTTPAddr(s, &c.HTTPAddr, httpAddr)
	s.Enum(&c.LogFormat, "log-format", "LOG_FORMAT", "json", []string{"json", "text"}, "log format")
	s.Enum(&c.LogLevel, "log-level", "LOG_LEVEL", "info", []string{"debug", "info", "warn", "error"}, "log level")
	s.Duration(&c.DBTimeout, "db-timeout", "DB_TIMEOUT", outbox.DefaultDBTimeout, 100*time.Millisecond, 10*time.Minute, "bound on each database round trip")
	s.Duration(&c.ShutdownTimeout, "shutdown-timeout", "SHUTDOWN_TIMEOUT", DefaultShutdownTimeout, time.Second, time.Hour, "bound on a graceful shutdown")
}

// Parse parses args with s and makes the root logger from c. When the
// program must stop instead (-h, or a bad setting, reported on stderr), it
// returns a nil logger and the exit code.
func Parse(name string, s *envflag.Set, args []string, c *Settings, stderr io.Writer) (*slog.Logger, int) {
	if code, stop := s.Command(args); stop {
		return nil, code
	}
	root, err := telemetry.NewLogger(stderr, c.LogFormat, c.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, 2
	}
	tuneGC()
	return root, 0
}

// GCPercent is the collector's target (GOGC) of a service whose
// environment sets none. A relay or a sender keeps little live data (a few
// MiB) and allocates for every message, so at Go's default of 100 it
// collected every few MiB allocated: 12 % of a sender's CPU and a quarter
// of a relay's went to the collector and to returning memory to the
// system only to fault it back. At 400 the heap may grow to five times
// the live data between collections, a few tens of MiB.
const GCPercent = 400

// tuneGC sets GCPercent unless GOGC is set, which the runtime has already
// applied.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(GCPercent)
	}
}

// StartTimeout bounds each step of Open (connecting to Postgres, ensuring
// the topology) but the wait for NATS, which lasts as long as NATS is away.
const StartTimeout = 30 * time.Second

// Telemetry serves a service's /metrics, /healthz and /readyz from the
// start of the process: while it waits for NATS, /healthz says it is alive
// (a liveness probe must not kill a process that waits) and /readyz that it
// is starting. Readiness is then decided from the component's own progress
// (SetReady), never by calling Postgres or NATS on a probe.
type Telemetry struct {
	// Registry holds the process's metrics: the Go and process collectors,
	// sendonce_build_info, sendonce_dependency_up, and what the components
	// register.
	Registry *prometheus.Registry

	readiness telemetry.Readiness
	deps      *telemetry.Dependencies
	pool      atomic.Pointer[pgxpool.Pool]
	nc        atomic.Pointer[nats.Conn]
	noNATS    bool
	stop      func()
}

// StartTelemetry makes the registry and serves it on addr (nothing is
// served when addr is empty). Stop it with Stop.
func StartTelemetry(addr string, log *slog.Logger) (*Telemetry, error) {
	return startTelemetry(addr, log, true)
}

// StartTelemetryWithoutNATS is StartTelemetry for a process that uses
// Postgres only (the receiver).
func StartTelemetryWithoutNATS(addr string, log *slog.Logger) (*Telemetry, error) {
	return startTelemetry(addr, log, false)
}

func startTelemetry(addr string, log *slog.Logger, withNATS bool) (*Telemetry, error) {
	t := &Telemetry{Registry: telemetry.NewRegistry(), deps: &telemetry.Dependencies{}, stop: func() {}, noNATS: !withNATS}
	t.deps.Add("postgres", func(ctx context.Context) error {
		p := t.pool.Load()
		if p == nil {
			return errors.New("not connected")
		}
		return p.Ping(ctx)
	})
	if withNATS {
		t.deps.Add("nats", func(context.Context) error {
			if nc := t.nc.Load(); nc == nil || !nc.IsConnected() {
				return errors.New("not connected")
			}
			return nil
		})
	}
	t.Registry.MustRegister(t.deps)
	if addr == "" {
		return t, nil
	}
	stop, err := telemetry.Start(addr, t.Registry, t.readiness.Check, log)
	if err != nil {
		return nil, fmt.Errorf("HTTP_ADDR: %w", err)
	}
	t.stop = stop
	return t, nil
}

// SetReady installs the readiness check, once the component runs: ready
// while the NATS connection is up and ready() (the component's own
// progress) says so.
func (t *Telemetry) SetReady(ready func() error) {
	t.readiness.Set(func() error {
		if t.noNATS {
			return ready()
		}
		if nc := t.nc.Load(); nc == nil || !nc.IsConnected() {
			status := "not connected"
			if nc != nil {
				status = nc.Status().String()
			}
			return fmt.Errorf("nats: %s", status)
		}
		return ready()
	})
}

// Stop stops serving.
func (t *Telemetry) Stop() { t.stop() }

// Options say what a service needs of its connections.
type Options struct {
	// Telemetry, when set, learns the connections for its dependency
	// gauges and readiness.
	Telemetry *Telemetry
	// Name identifies the process to NATS ("sendonce-relay").
	Name string
	// MinConns is the least size of the Postgres pool.
	MinConns int32
	// GenericPlans lets the pool's connections reuse generic plans once
	// sms_outbox is large enough (outbox.AllowGenericPlans): for the
	// senders and the receiver, whose small batches would otherwise spend
	// most of their Postgres time planning, and the relay, which plans its
	// queued write once per connection instead of once per batch.
	GenericPlans bool
	// PublishWindow and PublishAckTimeout bound asynchronous publications
	// (the relay's); zero leaves the library's defaults.
	PublishWindow     int
	PublishAckTimeout time.Duration
}

// Conns are a service's connections.
type Conns struct {
	Pool     *pgxpool.Pool
	NC       *nats.Conn
	JS       jetstream.JetStream
	Topology *streams.Topology
	// Keeper recreates the topology if the broker loses it while the
	// process runs (Run runs it). Register it for its metric.
	Keeper *streams.Keeper
}

// Open connects to Postgres, checks that its schema is at least the version
// this binary's migrations reach, connects to NATS, waiting for it as long
// as ctx allows when it is away at start-up (a broker outage is not a crash
// loop), and ensures (or, with NATS_ENSURE_TOPOLOGY=false, checks) the
// streams, the consumers and the senders' flow bucket, with NATS_REPLICAS
// copies each. Each step but the wait is bounded by StartTimeout. Errors
// name the setting to check.
func Open(ctx context.Context, c Settings, o Options, log *slog.Logger) (*Conns, error) {
	pool, err := OpenDatabase(ctx, c.Database, o, log)
	if err != nil {
		return nil, err
	}
	nc, js, err := natsconn.Connect(NATSConfig(c.NATS, o, log))
	if err != nil {
		pool.Close()
		return nil, err
	}
	cs := &Conns{Pool: pool, NC: nc, JS: js}
	if o.Telemetry != nil {
		o.Telemetry.nc.Store(nc)
	}
	if err := natsconn.WaitConnected(ctx, nc, log); err != nil {
		cs.Close()
		return nil, err
	}
	topoCtx, cancelTopo := context.WithTimeout(ctx, StartTimeout)
	defer cancelTopo()
	more := ensureFlowBucket(max(c.Topology.Replicas, 1))
	if cs.Topology, err = streams.Setup(topoCtx, js, c.Topology, log, more); err != nil {
		cs.Close()
		return nil, err
	}
	cs.Keeper, err = streams.NewKeeper(streams.KeeperConfig{
		Topology: cs.Topology, JetStream: js, Ensure: c.Topology.Ensure, EnsureMore: more, Logger: log,
	})
	if err != nil {
		cs.Close()
		return nil, err
	}
	return cs, nil
}

// OpenDatabase connects to Postgres within StartTimeout and checks that its
// schema is at least the version this binary's migrations reach. Errors
// name the setting to check.
func OpenDatabase(ctx context.Context, db Database, o Options, log *slog.Logger) (*pgxpool.Pool, error) {
	startCtx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	poolCfg, err := outbox.PoolConfig(db.URL, db.Pooler)
	if errors.Is(err, outbox.ErrUnparsableDSN) {
		return nil, errUnparsable
	}
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	poolCfg.MaxConns = max(poolCfg.MaxConns, o.MinConns)
	if o.GenericPlans {
		outbox.AllowGenericPlans(poolCfg, 0)
	}
	pool, err := pgxpool.NewWithConfig(startCtx, poolCfg)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if err := pool.Ping(startCtx); err != nil {
		pool.Close()
		return nil, connectError(err)
	}
	if err := checkStartupParameters(startCtx, pool, db); err != nil {
		pool.Close()
		return nil, err
	}
	// A binary on a schema older than it needs would fail every statement
	// that touches what the newer migrations added: refuse, and say which
	// versions (the upgrade order is migrate first, then the binaries).
	found, need, err := migrate.CheckEmbedded(startCtx, pool)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	log.Info("schema version", "found", found, "need", need)
	if o.Telemetry != nil {
		o.Telemetry.pool.Store(pool)
	}
	return pool, nil
}

// NATSConfig completes the bound NATS settings for a process named by o.
func NATSConfig(c natsconn.Config, o Options, log *slog.Logger) natsconn.Config {
	c.Name, c.PublishWindow, c.PublishAckTimeout, c.ConnectTimeout, c.Logger = o.Name, o.PublishWindow, o.PublishAckTimeout, 10*time.Second, log
	return c
}

// SetupTopology creates or updates the whole topology (the streams, the
// consumers and the senders' flow bucket) with replicas copies, as a
// process with NATS_ENSURE_TOPOLOGY=true does at start-up; relay setup runs
// it with credentials allowed to manage streams, so that the fleet can run
// without them.
func SetupTopology(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) (*streams.Topology, error) {
	return streams.Setup(ctx, js, streams.Settings{Ensure: true, Replicas: replicas}, log, ensureFlowBucket(max(replicas, 1)))
}

// ensureFlowBucket makes the senders' shared flow state (rate limit,
// provider pauses) part of the topology, so that senders without create
// permissions find it: created with the streams' replicas when missing, an
// existing one scaled up in place (never down), as the streams are.
func ensureFlowBucket(replicas int) func(context.Context, jetstream.JetStream) ([]string, error) {
	return func(ctx context.Context, js jetstream.JetStream) ([]string, error) {
		created, err := flow.EnsureBucket(ctx, js, replicas)
		if err != nil || created {
			if created {
				return []string{"key-value bucket " + flow.DefaultBucket + " created"}, nil
			}
			return nil, err
		}
		what, err := streams.ScaleUp(ctx, js, "KV_"+flow.DefaultBucket, replicas)
		if err != nil || what == "" {
			return nil, err
		}
		return []string{"key-value bucket " + flow.DefaultBucket + " " + what}, nil
	}
}

// Close closes the connections at once; Run drains NATS first.
func (c *Conns) Close() {
	c.NC.Close()
	c.Pool.Close()
}

// Run runs every loop until ctx ends or one of them fails, which stops the
// others; after ctx ends the loops have shutdown to finish their work. It
// then drains the NATS connection and returns the first loop's error.
func (c *Conns) Run(ctx context.Context, shutdown time.Duration, log *slog.Logger, loops ...func(context.Context) error) error {
	if c.Keeper != nil {
		loops = append(loops, c.Keeper.Run)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, loop := range loops {
		g.Go(func() error { return loop(gctx) })
	}
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		t := time.NewTimer(shutdown)
		defer t.Stop()
		select {
		case err = <-done:
		case <-t.C:
			return fmt.Errorf("shutdown did not finish within %s", shutdown)
		}
	}
	if err != nil {
		return err
	}
	if err := natsconn.Drain(c.NC, 5*time.Second); err != nil {
		log.Warn("nats drain", "err", err)
	}
	return nil
}

// StartTracing starts the process's OpenTelemetry traces when the OTEL_*
// variables ask for them (tracing.Enabled), and returns them with the
// function that flushes and stops them at exit; nil when off.
func StartTracing(ctx context.Context, name string, getenv func(string) string, log *slog.Logger) (*tracing.Tracing, func(), error) {
	t, err := tracing.Start(ctx, name, build.Read().Version, getenv)
	if err != nil || t == nil {
		return nil, func() {}, err
	}
	log.Info("tracing on: spans go to the OTLP endpoint of OTEL_EXPORTER_OTLP_ENDPOINT", "service", name)
	return t, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(ctx); err != nil {
			log.Warn("tracing: spans not exported at exit", "err", err)
		}
	}, nil
}

// RunTraced is a command's run with the process's traces: it starts them
// (StartTracing, as name), hands them to run, and flushes and stops them
// once run has returned. A failure to start them, or run's error, is logged
// as "<what> failed" and makes the exit code 1; the line is logged before
// the flush, which may wait for an OTLP endpoint that is away.
func RunTraced(ctx context.Context, name, what string, getenv func(string) string, log *slog.Logger, run func(*tracing.Tracing) error) int {
	tr, stop, err := StartTracing(ctx, name, getenv, log)
	if err != nil {
		log.Error(what+" failed", "err", err)
		return 1
	}
	defer stop()
	if err := run(tr); err != nil {
		log.Error(what+" failed", "err", err)
		return 1
	}
	return 0
}
