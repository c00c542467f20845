// Command smsstub runs the SMS provider stub of package
// internal/smsstub as a process, for the demo and for tests that need to
// flip its faults from outside.
//
// Every setting is a flag and an environment variable; a flag wins over
// the environment ("smsstub -h" lists them). Once
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
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/telemetry"
)

func main() { proc.Main(run) }

// options is the parsed command line.
type options struct {
	addr            string
	logFormat       string
	logLevel        string
	shutdownTimeout time.Duration
	seed            int
	receiptsSecret  string
	undelivered     string
	cfg             smsstub.Config
}

// bind binds every setting of the command; the stub's own defaults are the
// package's Default constants, so the command and smsstub.New agree.
func bind(s *envflag.Set, o *options) {
	f := &o.cfg.Faults
	s.String(&o.addr, "addr", "STUB_ADDR", "127.0.0.1:9090", "listen address (host:port); port 0 picks a free port")
	s.Secret(&o.cfg.APIKey, "api-key", "SMS_API_KEY", `require "Authorization: Bearer KEY"; empty disables auth`)
	s.Duration(&o.cfg.Retention, "retention", "STUB_RETENTION", smsstub.DefaultRetention, time.Millisecond, 100*365*24*time.Hour, "how long a key's stored response is replayed")
	s.Bool(&o.cfg.IgnoreKeys, "ignore-keys", "STUB_IGNORE_KEYS", false, "behave like a provider without idempotency: every request is a new delivery")
	s.Float(&f.FailRate, "fail-rate", "STUB_FAIL_RATE", 0, 0, 1, "probability of an injected failure")
	s.Int(&f.FailStatus, "fail-status", "STUB_FAIL_STATUS", smsstub.DefaultFailStatus, 400, 599, "HTTP status of an injected failure")
	s.Int(&f.FailCode, "fail-code", "STUB_FAIL_CODE", 0, 0, 1<<31-1, "provider error code in an injected failure's body; 0 omits it")
	s.Float(&f.RateLimitRate, "rate-limit-rate", "STUB_RATE_LIMIT_RATE", 0, 0, 1, "probability of an injected 429")
	s.Float(&f.RateLimit, "rate-limit", "STUB_RATE_LIMIT", 0, 0, 1e6, "requests per second taken, like an account's tier; above it: 429 without Retry-After (0: no limit)")
	s.Float(&f.RateBurst, "rate-burst", "STUB_RATE_BURST", 0, 0, 1e6, "token bucket size for -rate-limit (0: rate-limit/10)")
	s.Duration(&f.RetryAfter, "retry-after", "STUB_RETRY_AFTER", smsstub.DefaultRetryAfter, time.Millisecond, 24*time.Hour, "Retry-After of an injected 429 (sent as whole seconds, rounded up)")
	s.Duration(&f.Latency, "latency", "STUB_LATENCY", 0, 0, time.Hour, "fixed wait before a new request is processed")
	s.Duration(&f.LatencyJitter, "latency-jitter", "STUB_LATENCY_JITTER", 0, 0, time.Hour, "upper bound of a uniform extra delay")
	s.Float(&f.WithholdRate, "withhold-rate", "STUB_WITHHOLD_RATE", 0, 0, 1, "probability that an accepted message's response is withheld")
	s.Enum(&f.WithholdMode, "withhold-mode", "STUB_WITHHOLD_MODE", smsstub.WithholdHang, []string{smsstub.WithholdHang, smsstub.WithholdClose},
		"how a response is withheld: hang until the client gives up, or close the connection")
	s.Float(&f.DropRate, "drop-rate", "STUB_DROP_RATE", 0, 0, 1, "probability that a request is lost before it is taken (connection closed, nothing sent)")
	s.Float(&f.LookupFailRate, "lookup-fail-rate", "STUB_LOOKUP_FAIL_RATE", 0, 0, 1, "probability that a lookup (GET /v1/messages?reference=) fails with 500")
	r := &o.cfg.Receipts
	s.Secret(&o.receiptsSecret, "receipts-secret", "SMS_WEBHOOK_SECRET", "secret that signs delivery receipts (Sendonce-Signature) sent to each request's callback_url; empty sends none")
	s.Duration(&r.Delay, "receipt-delay", "STUB_RECEIPT_DELAY", smsstub.DefaultReceiptDelay, time.Millisecond, time.Hour, "time from acceptance to the message's fate (its receipt, and what a lookup shows)")
	s.Duration(&r.Jitter, "receipt-jitter", "STUB_RECEIPT_JITTER", 0, 0, time.Hour, "upper bound of a uniform extra delay of the fate")
	s.Float(&r.DuplicateRate, "receipt-duplicate-rate", "STUB_RECEIPT_DUPLICATE_RATE", 0, 0, 1, "probability that a receipt is sent twice")
	s.Float(&r.ReorderRate, "receipt-reorder-rate", "STUB_RECEIPT_REORDER_RATE", 0, 0, 1, "probability that an older accepted receipt follows the final one")
	t := &o.cfg.Twilio
	s.String(&t.AccountSID, "twilio-account-sid", "TWILIO_ACCOUNT_SID", "", "serve Twilio's Messages resource (/2010-04-01/Accounts/SID/Messages.json) for this account SID; empty serves none")
	s.Secret(&t.AuthToken, "twilio-auth-token", "TWILIO_AUTH_TOKEN", "the Twilio facade's auth token: basic-auth password, and the key its status callbacks are signed with (X-Twilio-Signature); required with -twilio-account-sid")
	s.Duration(&t.QueueFor, "twilio-queue-for", "STUB_TWILIO_QUEUE_FOR", smsstub.DefaultTwilioQueueFor, time.Millisecond, time.Hour, "how long a Twilio message stays queued, without date_sent, before it is sent")
	s.String(&o.undelivered, "undelivered-suffixes", "STUB_UNDELIVERED_SUFFIXES", "", "comma-separated number endings whose messages end undelivered (code 30003)")
	s.Int(&o.seed, "seed", "STUB_SEED", 0, math.MinInt, math.MaxInt, "random seed for reproducible faults; 0 seeds randomly")
	s.Enum(&o.logFormat, "log-format", "STUB_LOG_FORMAT", "json", []string{"json", "text"}, "log format on stderr")
	s.Enum(&o.logLevel, "log-level", "STUB_LOG_LEVEL", "info", []string{"debug", "info", "warn", "error"}, "log level (info logs each message taken, its number masked; debug every request)")
	s.Duration(&o.shutdownTimeout, "shutdown-timeout", "STUB_SHUTDOWN_TIMEOUT", 5*time.Second, time.Millisecond, time.Hour, "bound on a graceful shutdown")
}

// run is main without the process globals, so tests can drive it: it
// serves until ctx is done and returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var opts options
	fs := envflag.New("smsstub", getenv, stderr)
	bind(fs, &opts)
	if code, stop := fs.Command(args[1:]); stop {
		return code
	}
	if fs.FlagSet().NArg() > 0 {
		fmt.Fprintf(stderr, "smsstub: unexpected argument %q\n", fs.FlagSet().Arg(0))
		return 2
	}
	opts.cfg.Seed = int64(opts.seed)
	if opts.receiptsSecret != "" {
		opts.cfg.Receipts.Secret = []byte(opts.receiptsSecret)
	}
	for _, suf := range strings.Split(opts.undelivered, ",") {
		if suf = strings.TrimSpace(suf); suf != "" {
			opts.cfg.Receipts.UndeliveredSuffixes = append(opts.cfg.Receipts.UndeliveredSuffixes, suf)
		}
	}
	logger, err := telemetry.NewLogger(stderr, opts.logFormat, opts.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "smsstub: %v\n", err)
		return 2
	}
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
		"latency", f.Latency.String(), "latency_jitter", f.LatencyJitter.String(), "drop_rate", f.DropRate,
		"receipts", len(opts.cfg.Receipts.Secret) > 0, "undelivered_suffixes", len(opts.cfg.Receipts.UndeliveredSuffixes),
		"twilio", opts.cfg.Twilio.AccountSID != "")
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
