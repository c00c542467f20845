// Command smsstub runs the SMS provider stub of package
// internal/smsstub as a process, for the demo and for tests that need to
// flip its faults from outside.
//
// Every setting is a flag and an environment variable; the variable's value
// becomes the flag's default, so a flag wins over the environment. Once
// listening, the command prints exactly one line to stdout,
//
//	smsstub listening on http://127.0.0.1:9090
//
// with the real port when -addr asks for port 0. Logs go to stderr. SIGINT
// or SIGTERM shut it down gracefully within -shutdown-timeout; requests that
// are being withheld are dropped at once rather than waited for.
//
// Exit status: 0 after a clean shutdown or -h, 1 when serving fails, 2 for
// a bad flag, environment variable or argument.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/sendonce/sendonce/internal/smsstub"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options is the parsed command line.
type options struct {
	addr            string
	logFormat       string
	logLevel        slog.Level
	shutdownTimeout time.Duration
	cfg             smsstub.Config
}

// errUsage marks errors already reported to stderr by the flag package.
var errUsage = errors.New("usage error")

// run is main without the process globals, so tests can drive it: it
// serves until ctx is done and returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	opts, err := parseOptions(args, getenv, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "smsstub: %v\n", err)
		return 2
	}
	logger := newLogger(opts.logFormat, opts.logLevel, stderr)
	opts.cfg.Logger = logger
	if err := serve(ctx, opts, logger, stdout); err != nil {
		logger.Error("smsstub failed", "err", err)
		return 1
	}
	return 0
}

// serve runs the stub until ctx is done, then shuts it down.
func serve(ctx context.Context, opts options, logger *slog.Logger, stdout io.Writer) error {
	stub, err := smsstub.New(opts.cfg)
	if err != nil {
		return fmt.Errorf("configure stub: %w", err)
	}
	// Listen before announcing, so the printed address is live and carries
	// the real port when port 0 was asked for.
	ln, err := net.Listen("tcp", opts.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", opts.addr, err)
	}
	srv := &http.Server{
		Handler:           stub.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		// No write timeout: WithholdHang must be able to outlast any client.
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	f := opts.cfg.Faults
	logger.Info("smsstub listening",
		"addr", ln.Addr().String(), "auth", opts.cfg.APIKey != "", "ignore_keys", opts.cfg.IgnoreKeys,
		"retention", opts.cfg.Retention.String(), "fail_rate", f.FailRate, "rate_limit_rate", f.RateLimitRate,
		"withhold_rate", f.WithholdRate, "withhold_mode", f.WithholdMode,
		"latency", f.Latency.String(), "latency_jitter", f.LatencyJitter.String())
	if _, err := fmt.Fprintf(stdout, "%shttp://%s\n", smsstub.Announcement, ln.Addr()); err != nil {
		_ = srv.Close()
		<-served
		return fmt.Errorf("announce address: %w", err)
	}

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "timeout", opts.shutdownTimeout.String())
	// Release withheld and delayed requests first: Shutdown waits for
	// active requests, and a hanging one would otherwise hold it to the
	// deadline.
	_ = stub.Close()
	sctx, cancel := context.WithTimeout(context.Background(), opts.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("graceful shutdown timed out; closing connections", "err", err)
		_ = srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// setting is one flag with its environment variable.
type setting struct {
	flag, env, usage string
	value            flag.Value
	// secret keeps the value out of error messages and -h output.
	secret bool
}

// parseOptions reads the environment and then the flags. A bad environment
// value is reported naming the variable; a bad flag is reported by the flag
// package, naming the flag, and returned as errUsage.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{
		addr:            "127.0.0.1:9090",
		logFormat:       "json",
		logLevel:        slog.LevelInfo,
		shutdownTimeout: 5 * time.Second,
		cfg: smsstub.Config{
			Retention: smsstub.DefaultRetention,
			Faults: smsstub.Faults{
				FailStatus:   smsstub.DefaultFailStatus,
				RetryAfter:   smsstub.DefaultRetryAfter,
				WithholdMode: smsstub.WithholdHang,
			},
		},
	}
	f := &o.cfg.Faults
	settings := []setting{
		{"addr", "STUB_ADDR", "listen `address` (host:port); port 0 picks a free port", stringVal(&o.addr), false},
		{"api-key", "SMS_API_KEY", "require \"Authorization: Bearer `KEY`\"; empty disables auth", secretVal(&o.cfg.APIKey), true},
		{"retention", "STUB_RETENTION", "how long (a `duration`) a key's stored response is replayed", durationVal(&o.cfg.Retention, true), false},
		{"ignore-keys", "STUB_IGNORE_KEYS", "behave like a provider without idempotency: every request is a new delivery", boolVal(&o.cfg.IgnoreKeys), false},
		{"fail-rate", "STUB_FAIL_RATE", "`probability` in [0,1] of an injected failure", rateVal(&f.FailRate), false},
		{"fail-status", "STUB_FAIL_STATUS", "HTTP `status` in [400,599] of an injected failure", intVal(&f.FailStatus, 400, 599), false},
		{"fail-code", "STUB_FAIL_CODE", "provider error `code` in an injected failure's body; 0 omits it", intVal(&f.FailCode, 0, 1<<31-1), false},
		{"rate-limit-rate", "STUB_RATE_LIMIT_RATE", "`probability` in [0,1] of an injected 429", rateVal(&f.RateLimitRate), false},
		{"retry-after", "STUB_RETRY_AFTER", "Retry-After `duration` of an injected 429 (sent as whole seconds, rounded up)", durationVal(&f.RetryAfter, true), false},
		{"latency", "STUB_LATENCY", "fixed `duration` to wait before a new request is processed", durationVal(&f.Latency, false), false},
		{"latency-jitter", "STUB_LATENCY_JITTER", "upper bound (a `duration`) of a uniform extra delay", durationVal(&f.LatencyJitter, false), false},
		{"withhold-rate", "STUB_WITHHOLD_RATE", "`probability` in [0,1] that an accepted message's response is withheld", rateVal(&f.WithholdRate), false},
		{"withhold-mode", "STUB_WITHHOLD_MODE", "`mode` of withholding: hang (until the client gives up) or close (drop the connection)", enumVal(&f.WithholdMode, smsstub.WithholdHang, smsstub.WithholdClose), false},
		{"seed", "STUB_SEED", "random `seed` for reproducible faults; 0 seeds randomly", int64Val(&o.cfg.Seed), false},
		{"log-format", "STUB_LOG_FORMAT", "log `format` on stderr: json or text", enumVal(&o.logFormat, "json", "text"), false},
		{"log-level", "STUB_LOG_LEVEL", "log `level`: debug, info, warn or error (debug logs every request)", levelVal(&o.logLevel), false},
		{"shutdown-timeout", "STUB_SHUTDOWN_TIMEOUT", "how long (a `duration`) a graceful shutdown may take", durationVal(&o.shutdownTimeout, true), false},
	}

	name := "smsstub"
	if len(args) > 0 {
		name = args[0]
		args = args[1:]
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, s := range settings {
		if v := getenv(s.env); v != "" {
			if err := s.value.Set(v); err != nil {
				return options{}, fmt.Errorf("invalid %s %q: %w", s.env, redact(s, v), err)
			}
		}
		// Registered after the environment was applied, so -h shows the
		// effective defaults.
		fs.Var(s.value, s.flag, s.usage+" (env "+s.env+")")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return options{}, err
		}
		return options{}, errUsage
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

// redact keeps secrets out of error messages.
func redact(s setting, v string) string {
	if s.secret {
		return "[redacted]"
	}
	return v
}

func newLogger(format string, level slog.Level, w io.Writer) *slog.Logger {
	hopts := &slog.HandlerOptions{Level: level}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, hopts))
	}
	return slog.New(slog.NewJSONHandler(w, hopts))
}

// value is a flag.Value that parses into *p; it serves the environment
// and the command line alike so that both validate the same way.
type value[T any] struct {
	p      *T
	parse  func(string) (T, error)
	format func(T) string
	isBool bool
}

func (v *value[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

func (v *value[T]) String() string {
	// The flag package calls String on a zero value to detect defaults.
	if v == nil || v.p == nil {
		return ""
	}
	return v.format(*v.p)
}

// IsBoolFlag lets boolean flags be given without a value.
func (v *value[T]) IsBoolFlag() bool { return v.isBool }

func stringVal(p *string) *value[string] {
	return &value[string]{p: p, parse: func(s string) (string, error) { return s, nil }, format: func(s string) string { return s }}
}

// secretVal is stringVal whose String is always empty, so -h never shows
// the value taken from the environment.
func secretVal(p *string) *value[string] {
	return &value[string]{p: p, parse: func(s string) (string, error) { return s, nil }, format: func(string) string { return "" }}
}

func boolVal(p *bool) *value[bool] {
	return &value[bool]{p: p, parse: strconv.ParseBool, format: strconv.FormatBool, isBool: true}
}

func rateVal(p *float64) *value[float64] {
	return &value[float64]{p: p, format: func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) },
		parse: func(s string) (float64, error) {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return 0, errors.New("not a number")
			}
			if !(f >= 0 && f <= 1) {
				return 0, errors.New("must be within [0, 1]")
			}
			return f, nil
		}}
}

func intVal(p *int, lo, hi int) *value[int] {
	return &value[int]{p: p, format: strconv.Itoa,
		parse: func(s string) (int, error) {
			n, err := strconv.Atoi(s)
			if err != nil {
				return 0, errors.New("not an integer")
			}
			if n < lo || n > hi {
				return 0, fmt.Errorf("must be within [%d, %d]", lo, hi)
			}
			return n, nil
		}}
}

func int64Val(p *int64) *value[int64] {
	return &value[int64]{p: p, format: func(n int64) string { return strconv.FormatInt(n, 10) },
		parse: func(s string) (int64, error) {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, errors.New("not an integer")
			}
			return n, nil
		}}
}

// durationVal parses Go durations such as "250ms"; positive demands more
// than zero, otherwise zero is allowed.
func durationVal(p *time.Duration, positive bool) *value[time.Duration] {
	return &value[time.Duration]{p: p, format: time.Duration.String,
		parse: func(s string) (time.Duration, error) {
			d, err := time.ParseDuration(s)
			if err != nil {
				return 0, errors.New("not a duration such as 250ms or 2s")
			}
			if d < 0 || (positive && d == 0) {
				if positive {
					return 0, errors.New("must be positive")
				}
				return 0, errors.New("must not be negative")
			}
			return d, nil
		}}
}

func enumVal(p *string, allowed ...string) *value[string] {
	return &value[string]{p: p, format: func(s string) string { return s },
		parse: func(s string) (string, error) {
			for _, a := range allowed {
				if s == a {
					return s, nil
				}
			}
			return "", fmt.Errorf("must be one of %q", allowed)
		}}
}

func levelVal(p *slog.Level) *value[slog.Level] {
	return &value[slog.Level]{p: p, format: slog.Level.String,
		parse: func(s string) (slog.Level, error) {
			var l slog.Level
			if err := l.UnmarshalText([]byte(s)); err != nil {
				return 0, errors.New("must be debug, info, warn or error")
			}
			return l, nil
		}}
}
