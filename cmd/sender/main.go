// Command sender consumes the JetStream consumer "senders" and sends each
// message through the SMS provider, exactly once as the user sees it. Run as
// many as needed; they share the durable consumer.
//
// Every flag has an environment variable; run "sender -h" for the list.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/tracing"
)

func main() { proc.Main(run) }

type config struct {
	service.Settings
	// tracing is the process's traces (OTEL_*); nil when off.
	tracing *tracing.Tracing
	// idempotentSet: SMS_API_IDEMPOTENT (or its flag) was given.
	idempotentSet bool
	provider      provider.Settings
	concurrency   int
	claimLinger   time.Duration
	writeLinger   time.Duration
	lease         time.Duration
	retryBase     time.Duration
	retryCap      time.Duration
	rateLimit     float64
	rateBurst     float64
	rateSenders   int
	normalShare   float64
	bulkShare     float64
	lookupBudget  int
	overdue       time.Duration
	overdueLooks  int
	overdueRate   float64
	// laneProviders is SMS_LANE_PROVIDERS, parsed by the check.
	laneProvidersRaw string
	laneProviders    map[string]string
}

func bind(s *envflag.Set, c *config) {
	service.Bind(s, &c.Settings, "127.0.0.1:9102")
	provider.BindSettings(s, &c.provider)
	s.Group("sending: calls in flight, claims, retries")
	s.Int(&c.concurrency, "concurrency", "SENDER_CONCURRENCY", 32, 1, 10000, "provider calls in flight")
	s.Duration(&c.claimLinger, "claim-linger", "SENDER_CLAIM_LINGER", sender.DefaultClaimLinger, 0, time.Second, "how long a claim waits for busy slots while messages wait, to claim them in one batch (0: claim at once)")
	s.Duration(&c.writeLinger, "write-linger", "SENDER_WRITE_LINGER", sender.DefaultWriteLinger, 0, time.Second, "how long a status write waits for the outcomes of calls still running, to commit them together (0: write at once)")
	s.Duration(&c.lease, "lease", "SENDER_LEASE", 0, 0, time.Hour, "how long a claimed row is held for its attempt (0: 2*SMS_API_TIMEOUT+5s)")
	s.Duration(&c.retryBase, "retry-base", "RETRY_BASE", 500*time.Millisecond, time.Millisecond, time.Hour, "backoff base: delay ~ U(0, min(cap, base*2^attempt))")
	s.Duration(&c.retryCap, "retry-cap", "RETRY_CAP", 60*time.Second, time.Millisecond, 24*time.Hour, "backoff cap")
	s.Group("flow: the shared rate limit and the lanes")
	s.Float(&c.rateLimit, "sms-rate-limit", "SMS_RATE_LIMIT", 0, 0, 1e6, "provider requests per second across all sender processes, shared through NATS (0: no limit); size it to the provider account's tier")
	s.Float(&c.rateBurst, "sms-rate-burst", "SMS_RATE_BURST", 0, 0, 1e6, "provider requests sent at once across all senders after an idle spell, split among them, at least one each (0: SMS_RATE_LIMIT/10, at least 1)")
	s.Int(&c.rateSenders, "sms-rate-senders", "SMS_RATE_SENDERS", flow.DefaultExpectedSenders, 1, 10000, "sender processes you run: a sender that cannot read the shared rate limit in NATS (it started while that was out of reach, or lost it) keeps to SMS_RATE_LIMIT divided by this or by the senders it last saw, whichever is more")
	s.Float(&c.normalShare, "normal-min-share", "SENDER_NORMAL_MIN_SHARE", sender.DefaultNormalMinShare, 0, 0.9, "least part of a sender's work the normal lane gets while urgent messages keep coming")
	s.Float(&c.bulkShare, "bulk-min-share", "SENDER_BULK_MIN_SHARE", sender.DefaultBulkMinShare, 0, 0.9, "least part of a sender's work the bulk lane gets while urgent and normal messages keep coming")
	s.String(&c.laneProvidersRaw, "lane-providers", "SMS_LANE_PROVIDERS", "", "a preferred provider per priority lane among SMS_PROVIDERS, e.g. urgent=twilio,bulk=vonage: a new message of that lane goes there while its circuit is closed (the others go to the first of SMS_PROVIDERS)")
	s.Group("lookups and overdue receipts")
	s.Int(&c.lookupBudget, "sms-api-lookup-budget", "SMS_API_LOOKUP_BUDGET", sender.DefaultLookupBudget, 1, 1000, "lookups that may fail (spaced by the backoff) before the message ends unknown")
	s.Duration(&c.overdue, "receipt-overdue", "SENDER_RECEIPT_OVERDUE", sender.DefaultReceiptOverdue, 0, 7*24*time.Hour, "how long a sent message may go without a delivery receipt before the provider is asked for its fate, with RECEIPTS_PUBLIC_URL and SMS_API_LOOKUP (0: never); at least 1m")
	s.Int(&c.overdueLooks, "receipt-overdue-looks", "SENDER_RECEIPT_OVERDUE_LOOKS", sender.DefaultReceiptOverdueLooks, 1, 100, "how many times a message whose receipt is overdue is looked up, at SENDER_RECEIPT_OVERDUE after it was sent and each next time twice as long after (at most a day apart); after the last it stays sent")
	s.Float(&c.overdueRate, "receipt-overdue-rate", "SENDER_RECEIPT_OVERDUE_RATE", sender.DefaultReceiptOverdueRate, 0.01, 1000, "most lookups a second of messages whose receipt is overdue, per sender; each also takes a token of SMS_RATE_LIMIT that no send is waiting for")
	s.Check(func() error {
		lp, err := parseLaneProviders(c.laneProvidersRaw, c.provider)
		if err != nil {
			return fmt.Errorf("-lane-providers / SMS_LANE_PROVIDERS: %w", err)
		}
		c.laneProviders = lp
		if c.overdue > 0 && c.overdue < time.Minute {
			return fmt.Errorf("-receipt-overdue / SENDER_RECEIPT_OVERDUE (%s) must be 0 or at least 1m: receipts take seconds to come, and a shorter time would look up nearly every message", c.overdue)
		}
		if c.retryCap < c.retryBase {
			return fmt.Errorf("-retry-cap / RETRY_CAP (%s) is below -retry-base / RETRY_BASE (%s)", c.retryCap, c.retryBase)
		}
		if c.normalShare+c.bulkShare >= 1 {
			return fmt.Errorf("-normal-min-share / SENDER_NORMAL_MIN_SHARE (%g) and -bulk-min-share / SENDER_BULK_MIN_SHARE (%g) must add up to less than 1", c.normalShare, c.bulkShare)
		}
		if c.rateBurst > 0 && c.rateLimit == 0 {
			return errors.New("-sms-rate-burst / SMS_RATE_BURST is set without -sms-rate-limit / SMS_RATE_LIMIT")
		}
		if timeout := c.provider.Timeout; c.lease != 0 && c.lease <= timeout {
			return fmt.Errorf("-lease / SENDER_LEASE (%s) must exceed -sms-api-timeout / SMS_API_TIMEOUT (%s)", c.lease, timeout)
		}
		if timeout := c.provider.Timeout; c.provider.LooksUp() && c.lease != 0 && c.lease <= 2*timeout {
			return fmt.Errorf("-lease / SENDER_LEASE (%s) must exceed twice -sms-api-timeout / SMS_API_TIMEOUT (%s) with SMS_API_LOOKUP: a lookup and the call after it run under one lease", c.lease, timeout)
		}
		return nil
	})
}

// parseLaneProviders reads SMS_LANE_PROVIDERS: lane=provider pairs, each
// lane once, each provider one of SMS_PROVIDERS.
func parseLaneProviders(raw string, p provider.Settings) (map[string]string, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	if !p.Failover() {
		return nil, errors.New("needs SMS_PROVIDERS: with one provider there is nothing to prefer")
	}
	names, err := p.Names()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, pair := range strings.Split(raw, ",") {
		lane, prov, ok := strings.Cut(strings.TrimSpace(pair), "=")
		lane, prov = strings.TrimSpace(lane), strings.TrimSpace(prov)
		switch {
		case !ok:
			return nil, fmt.Errorf("%q is not lane=provider", pair)
		case lane != "urgent" && lane != "normal" && lane != "bulk":
			return nil, fmt.Errorf("no lane %q (urgent, normal, bulk)", lane)
		case out[lane] != "":
			return nil, fmt.Errorf("lane %s is named twice", lane)
		case !slices.Contains(names, prov):
			return nil, fmt.Errorf("provider %q of lane %s is not in SMS_PROVIDERS", prov, lane)
		}
		out[lane] = prov
	}
	return out, nil
}

// flowID names this process in the shared flow state: host and process id,
// and a random suffix so that a restarted process is a new sender.
func flowID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, host)
	return fmt.Sprintf("%s_%d_%s", cmp.Or(host, "sender"), os.Getpid(), uuid.NewString()[:8])
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var c config
	s := envflag.New("sender", getenv, stderr)
	bind(s, &c)
	root, code := service.Parse("sender", s, args[1:], &c.Settings, stderr)
	if root == nil {
		return code
	}
	// The packages name their own component on root; this logger is for the
	// command's own lines.
	log := root.With("component", "sender")
	c.idempotentSet = getenv("SMS_API_IDEMPOTENT") != "" || slices.ContainsFunc(args[1:], func(a string) bool {
		return strings.HasPrefix(strings.TrimLeft(a, "-"), "sms-api-idempotent")
	})
	return service.RunTraced(ctx, "sendonce-sender", "sender", getenv, log, func(tr *tracing.Tracing) error {
		c.tracing = tr
		return runSender(ctx, c, root, log)
	})
}

// root goes to the packages, which name their component on it; log is
// the command's own.
func runSender(ctx context.Context, c config, root, log *slog.Logger) error {
	provs, err := c.provider.Clients(c.concurrency)
	if err != nil {
		return err
	}
	// A traced message's provider requests are spans of its trace, and
	// carry its traceparent.
	for _, p := range provs {
		p.Client.WrapTransport(c.tracing.Transport)
	}
	for _, w := range promiseWarnings(c.provider, provs, c.idempotentSet) {
		log.Warn(w)
	}
	prov := provs[0].Client
	// Every provider is named, the only one too: a row names the provider
	// that may hold its message, and a sender takes the rows that name one
	// of its providers, so going back from SMS_PROVIDERS to SMS_PROVIDER
	// leaves the rows of the provider kept with it.
	routes := make([]sender.Route, 0, len(provs))
	for _, p := range provs {
		routes = append(routes, sender.Route{Name: p.Name, Provider: p.Client})
	}

	tel, err := service.StartTelemetry(c.HTTPAddr, log)
	if err != nil {
		return err
	}
	defer tel.Stop()
	conns, err := service.Open(ctx, c.Settings, service.Options{
		// One connection per claim and status-write loop, plus headroom.
		Telemetry: tel, Name: "sendonce-sender", MinConns: 8, GenericPlans: true,
	}, log)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("sender stopped before it started", "err", err)
			return nil
		}
		return err
	}
	defer conns.Close()

	reg := tel.Registry
	reg.MustRegister(conns.Keeper)
	// The sender reports its demand to the shared limit; the limit gives
	// the sender its tokens.
	var snd *sender.Sender
	lim, err := flow.New(flow.Config{
		JetStream: conns.JS, Create: c.Topology.Ensure, Replicas: max(c.Topology.Replicas, 1), Limit: c.rateLimit, Burst: c.rateBurst,
		ExpectedSenders: c.rateSenders, ID: flowID(), Demand: func() int { return snd.Waiting() }, Logger: root, Registerer: reg,
		Circuits: func() map[string]string {
			if snd == nil {
				return nil
			}
			return snd.Circuits()
		},
	})
	if err != nil {
		return fmt.Errorf("SMS_RATE_LIMIT: %w", err)
	}
	snd, err = sender.New(sender.Config{
		Pool: conns.Pool, JetStream: conns.JS, Provider: prov, Routes: routes, LaneProviders: c.laneProviders, Concurrency: c.concurrency,
		ClaimLinger: cmp.Or(c.claimLinger, -1), WriteLinger: cmp.Or(c.writeLinger, -1),
		Lease: c.lease, RetryBase: c.retryBase, RetryCap: c.retryCap, DBTimeout: c.DBTimeout,
		ShutdownTimeout: c.ShutdownTimeout, NormalMinShare: c.normalShare, BulkMinShare: c.bulkShare,
		LookupSettle: c.provider.LookupSettle, LookupBudget: c.lookupBudget, LookupRetention: c.provider.LookupRetention, Flow: lim, Logger: root, Registerer: reg,
		Tracing: c.tracing,
	})
	if err != nil {
		return err
	}
	sweep, err := sender.NewReceiptSweep(sender.ReceiptSweepConfig{
		Pool: conns.Pool, Provider: prov, Routes: routes, Receipts: c.provider.ReceiptsURL != "", Overdue: c.overdue,
		Looks: c.overdueLooks, Rate: c.overdueRate, Flow: lim, DBTimeout: c.DBTimeout,
		ShutdownTimeout: c.ShutdownTimeout, Logger: root, Registerer: reg,
	})
	if err != nil {
		return err
	}
	loops := []func(context.Context) error{snd.Run, lim.Run}
	if sweep.Enabled() {
		loops = append(loops, sweep.Run)
	}
	// Ready from local state only: the NATS connection and the sender's own
	// fetches and claims. A message may wait for a free slot about a lease:
	// allow twice that, and at least a minute.
	lease := c.lease
	if lease == 0 {
		lease = 2*c.provider.Timeout + 5*time.Second
	}
	stall := max(time.Minute, 2*lease)
	tel.SetReady(func() error { return snd.Ready(stall) })
	names, _ := c.provider.Names()
	log.Info("sender started", "providers", strings.Join(names, ","), "concurrency", c.concurrency, "idempotent_provider", prov.Idempotent(),
		"api_timeout", c.provider.Timeout.String(), "rate_limit", c.rateLimit,
		"lookups", prov.CanLookup() && !prov.Idempotent(), "receipts", c.provider.ReceiptsURL != "",
		"receipt_sweep", sweep.Enabled())
	// The sender itself gives up on what it holds at the shutdown timeout;
	// the wait here is the backstop for a drain stuck elsewhere.
	if err := conns.Run(ctx, c.ShutdownTimeout+5*time.Second, log, loops...); err != nil {
		return err
	}
	log.Info("sender stopped")
	return nil
}

// promiseWarnings names each setting combination that weakens "exactly once
// as the user sees it" without being wrong: a provider that honours no key
// with neither lookups nor receipts to settle a lost answer, a generic
// provider over https without a key, SMS_API_IDEMPOTENT where the
// provider's own API decides. Start-up goes on; each is logged.
func promiseWarnings(p provider.Settings, provs []provider.Named, idempotentSet bool) []string {
	var out []string
	for _, n := range provs {
		if !n.Client.Idempotent() && !n.Client.CanLookup() && p.ReceiptsURL == "" {
			out = append(out, fmt.Sprintf("%s honours no Idempotency-Key and neither lookups (SMS_API_LOOKUP) nor receipts (RECEIPTS_PUBLIC_URL) are on: "+
				"a message whose answer is lost ends unknown, for a person to settle (relay resolve, the console)", n.Name))
		}
		if n.Name != "generic" && idempotentSet {
			out = append(out, fmt.Sprintf("SMS_API_IDEMPOTENT is for the generic provider only; %s's own API decides (idempotent: %v)", n.Name, n.Client.Idempotent()))
		}
		if n.Name == "generic" && strings.HasPrefix(p.BaseURL, "https://") && p.APIKey == "" {
			out = append(out, "the generic provider is https but SMS_API_KEY is empty: requests carry no credentials")
		}
	}
	return out
}
