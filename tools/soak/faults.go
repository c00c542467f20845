package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/smsstub"
)

// faultKinds are the faults the soak injects, in the order they are
// reported.
var faultKinds = []string{
	"sender_kill",    // SIGKILL a sender, restart it after a pause
	"relay_kill",     // SIGKILL a relay, restart it after a pause
	"crashpoint",     // restart a relay or sender armed to SIGKILL itself at a protocol point
	"sender_term",    // SIGTERM a sender (graceful drain), restart it
	"broker_restart", // stop the NATS server, start it again on the same port and store
	"lost_responses", // the stub accepts messages and withholds the responses
	"burst_5xx",      // the stub fails half the requests with 503
	"storm_429",      // the stub rate-limits half the requests, Retry-After 1s
	"provider_reset", // reset the connections between senders and stub after the request
	"db_cut",         // cut relays' and senders' database connections
	"db_outage",      // partition Postgres from relays and senders for 15-35 s
	// Every sender in turn stopped gracefully (SIGTERM) and started again,
	// with the provider slowed so that each holds messages it fetched and
	// has not started: they go back to JetStream unclaimed, which is no
	// doubt (a rolling restart, the most routine act there is).
	"rolling_restart",
}

// lookupFaultKinds are drawn besides faultKinds where the senders look up
// (-provider lookup and twilio): faults that compose with lost answers,
// which only a lookup can settle.
var lookupFaultKinds = []string{
	// Answers withheld (calls in flight), the replication link cut, the
	// primary killed 2s later, the standby promoted, and a new standby
	// made from it (pgFailover).
	"pg_failover",
	// The provider takes messages and never sends their receipts (half of
	// them, for a few seconds): only the senders' overdue-receipt sweep,
	// asking the provider about rows sent a minute ago, settles them, as
	// it settles the receipts an old primary took with it.
	"receipts_lost",
}

// earlyKinds come in the first third of the first deck: a short run (the
// 5,000 rows of CI) sees fewer faults than a deck holds, and these are the
// composed faults and the routine operation it is run for.
var earlyKinds = []string{"pg_failover", "receipts_lost", "rolling_restart"}

// kindsFor returns the fault kinds drawn for a provider mode. At a provider
// without idempotency and without lookups, a sender killed mid-call, a lost
// response and a reset response make an outcome unknown by nature; the
// others must not. With lookups, every kind is drawn.
func kindsFor(provider string) []string {
	switch provider {
	case providerIdempotent:
		return faultKinds
	case providerLookup, providerTwilio, providerFailover:
		// Lookups settle what a lost answer leaves open.
		return append(faultKinds[:len(faultKinds):len(faultKinds)], lookupFaultKinds...)
	}
	var out []string
	for _, k := range faultKinds {
		switch {
		case provider == providerPair && (k == "sender_kill" || k == "crashpoint" || k == "broker_restart"):
			// With SMS_PROVIDERS and no lookups, a message fetched by a
			// killed sender (or held through a broker restart) comes back
			// looking like one whose claim a failover lost: a provider
			// that cannot be asked then makes the row unknown, by design.
			// Routine operations and the provider's faults must not.
		case provider == providerNonIdempotent && (k == "sender_kill" || k == "crashpoint" || k == "lost_responses" || k == "provider_reset"):
		default:
			out = append(out, k)
		}
	}
	return out
}

// faultCounts counts injected faults by kind.
type faultCounts struct {
	mu     sync.Mutex
	kinds  []string // reported, in this order; nil: faultKinds
	byKind map[string]int
}

func (f *faultCounts) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byKind == nil {
		f.byKind = map[string]int{}
	}
	f.byKind[kind]++
}

func (f *faultCounts) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.byKind {
		n += v
	}
	return n
}

// summary is "N (kind n, kind n, ...)" with every kind, in the order of
// kinds.
func (f *faultCounts) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	kinds := f.kinds
	if kinds == nil {
		kinds = faultKinds
	}
	n := 0
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		n += f.byKind[k]
		parts = append(parts, fmt.Sprintf("%s %d", k, f.byKind[k]))
	}
	return fmt.Sprintf("%d (%s)", n, strings.Join(parts, ", "))
}

// maxFaults bounds the fault loop whatever the load phase's length.
const maxFaults = 100_000

// faultLoop injects one fault at a time, after a random pause, until stop
// is closed. Kinds are dealt from a shuffled deck of every kind, so each
// kind comes up as often as the others and none is missed for long.
func (s *soak) faultLoop(ctx context.Context, stop <-chan struct{}) {
	var deck []string
	for n := 1; n <= maxFaults; n++ {
		gap := s.uniform(s.cfg.faultInterval/3, s.cfg.faultInterval)
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-time.After(gap):
		}
		if len(deck) == 0 {
			deck = append(deck, s.kinds()...)
			s.rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
			if n == 1 {
				bringForward(deck, earlyKinds, s.rng)
			}
		}
		kind := deck[0]
		deck = deck[1:]
		began := clock(time.Since(s.start))
		detail, injected, err := s.inject(ctx, kind)
		switch {
		case err != nil:
			s.logf("fault %s (from %s): %v", kind, began, err)
		case injected:
			s.faults.add(kind)
			s.logf("fault #%d %s (from %s): %s", s.faults.total(), kind, began, detail)
		default:
			s.logf("fault %s (from %s) not injected: %s", kind, began, detail)
		}
	}
}

// bringForward moves each of early found in deck's last two thirds to a
// random place in its first third that holds none of them, while there is
// one.
func bringForward(deck, early []string, rng *rand.Rand) {
	third := max(1, len(deck)/3)
	for i := third; i < len(deck); i++ {
		if !slices.Contains(early, deck[i]) {
			continue
		}
		var free []int
		for j := range third {
			if !slices.Contains(early, deck[j]) {
				free = append(free, j)
			}
		}
		if len(free) == 0 {
			return
		}
		j := free[rng.IntN(len(free))]
		deck[i], deck[j] = deck[j], deck[i]
	}
}

// uniform draws a duration from [lo, hi].
func (s *soak) uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)+1))
}

func (s *soak) pick(slots []*slot) *slot { return slots[s.rng.IntN(len(slots))] }

// inject applies one fault of kind and undoes it; it reports what it did and
// whether the fault happened.
func (s *soak) inject(ctx context.Context, kind string) (string, bool, error) {
	switch kind {
	case "sender_kill":
		return s.signalRestart(ctx, s.pick(s.senders), syscall.SIGKILL)
	case "relay_kill":
		return s.signalRestart(ctx, s.pick(s.relays), syscall.SIGKILL)
	case "sender_term":
		return s.signalRestart(ctx, s.pick(s.senders), syscall.SIGTERM)
	case "crashpoint":
		return s.crashPoint(ctx)
	case "nats_leader_kill", "nats_consumer_leader_kill", "nats_node_restart", "nats_node_store_loss":
		return s.clusterFault(ctx, kind)
	case "broker_restart":
		pause := s.uniform(time.Second, 5*time.Second)
		s.broker.stop()
		_ = sleepCtx(ctx, pause)
		if err := s.broker.start(); err != nil {
			return "", false, err
		}
		return fmt.Sprintf("nats down for %s", pause.Round(time.Millisecond)), true, nil
	case "lost_responses":
		mode := smsstub.WithholdHang
		if s.rng.IntN(2) == 0 {
			mode = smsstub.WithholdClose
		}
		rate := 0.2 + 0.3*s.rng.Float64()
		return s.stubFault(ctx, smsstub.Faults{WithholdRate: rate, WithholdMode: mode},
			fmt.Sprintf("withhold_rate %.2f mode %s", rate, mode))
	case "burst_5xx":
		return s.stubFault(ctx, smsstub.Faults{FailRate: 0.5, FailStatus: 503}, "fail_rate 0.5 fail_status 503")
	case "storm_429":
		return s.stubFault(ctx, smsstub.Faults{RateLimitRate: 0.5, RetryAfter: time.Second}, "rate_limit_rate 0.5 retry_after 1s")
	case "provider_reset":
		d := s.uniform(500*time.Millisecond, 1500*time.Millisecond)
		if err := s.apiProxy.addToxic("soak_reset", "reset_peer", "downstream", map[string]any{"timeout": 0}); err != nil {
			return "", false, err
		}
		_ = sleepCtx(ctx, d)
		if err := s.apiProxy.removeToxic("soak_reset"); err != nil {
			return "", true, err
		}
		return fmt.Sprintf("responses reset for %s", d.Round(time.Millisecond)), true, nil
	case "db_cut":
		return s.dbCut(ctx)
	case "db_outage":
		return s.dbOutage(ctx)
	case "pg_failover":
		return s.pgFailover(ctx)
	case "receipts_lost":
		return s.stubFault(ctx, smsstub.Faults{ReceiptLossRate: 0.5}, "receipt_loss_rate 0.5")
	case "rolling_restart":
		return s.rollingRestart(ctx)
	}
	return "", false, fmt.Errorf("unknown fault kind %q", kind)
}

// signalRestart sends sig to the slot's process, waits for it to exit,
// pauses and starts it again.
func (s *soak) signalRestart(ctx context.Context, sl *slot, sig syscall.Signal) (string, bool, error) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	p := sl.cur.Load()
	if p == nil || p.Exited() {
		return sl.name + " was not running", false, sl.startLocked(ctx, nil)
	}
	note := ""
	if sig == syscall.SIGTERM {
		if !p.Stop(syscall.SIGTERM, 25*time.Second) {
			s.termUnclean.Add(1)
			note = " (UNCLEAN: did not exit within 25s of SIGTERM, killed)"
			s.logf("UNCLEAN: %s did not exit within 25s of SIGTERM; see %s.log", sl.name, sl.name)
		} else if p.Err() != nil {
			s.termUnclean.Add(1)
			note = fmt.Sprintf(" (UNCLEAN: %s)", p.Status())
			s.logf("UNCLEAN: %s ended %s after SIGTERM; see %s.log", sl.name, p.Status(), sl.name)
		}
	} else {
		p.Stop(sig, 10*time.Second)
	}
	pause := s.uniform(200*time.Millisecond, 2*time.Second)
	_ = sleepCtx(ctx, pause)
	if err := sl.startLocked(ctx, nil); err != nil {
		return "", true, err
	}
	return fmt.Sprintf("%s %s, restarted after %s%s", sl.name, sigName(sig), pause.Round(time.Millisecond), note), true, nil
}

// rollingRestart stops every sender gracefully in turn and starts it
// again, as a deployment does, while the provider answers slowly (300 ms a
// new message), so that each sender holds fetched messages it has not
// started when it stops.
func (s *soak) rollingRestart(ctx context.Context) (string, bool, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_, err := smsstub.PostFaults(actx, s.stub.url, smsstub.Faults{Latency: 300 * time.Millisecond, GenericOnly: s.cfg.provider == providerPair})
	cancel()
	if err != nil {
		return "", false, err
	}
	var steps []string
	var stepErr error
	for _, sl := range s.senders {
		_ = sleepCtx(ctx, s.uniform(500*time.Millisecond, 1500*time.Millisecond))
		what, _, err := s.signalRestart(ctx, sl, syscall.SIGTERM)
		if err != nil {
			stepErr = err
			break
		}
		steps = append(steps, what)
	}
	cctx, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel2()
	if _, err := smsstub.PostFaults(cctx, s.stub.url, smsstub.Faults{}); err != nil {
		return "", true, errors.Join(stepErr, err)
	}
	if stepErr != nil {
		return strings.Join(steps, "; "), true, stepErr
	}
	return "provider latency 300ms; " + strings.Join(steps, "; "), true, nil
}

func sigName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

// crashPoint restarts a relay or a sender armed to SIGKILL itself at the
// N-th hit of its crash point, waits for it to die there, and restarts it
// normally. A point not reached within 30s is disarmed and not counted.
func (s *soak) crashPoint(ctx context.Context) (string, bool, error) {
	var sl *slot
	var spec string
	if s.rng.IntN(2) == 0 {
		sl = s.pick(s.relays)
		spec = fmt.Sprintf("%s=%d", crashpoint.RelayAfterPubAck, 1+s.rng.IntN(5))
	} else {
		sl = s.pick(s.senders)
		spec = fmt.Sprintf("%s=%d", crashpoint.SenderAfterAccept, 1+s.rng.IntN(40))
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if p := sl.cur.Load(); p != nil && !p.Exited() {
		if !p.Stop(syscall.SIGTERM, 25*time.Second) {
			s.termUnclean.Add(1)
			s.logf("UNCLEAN: %s did not exit within 25s of SIGTERM; see %s.log", sl.name, sl.name)
		}
	}
	if err := sl.startLocked(ctx, []string{crashpoint.Env + "=" + spec}); err != nil {
		return "", false, err
	}
	armed := sl.cur.Load()
	hit := false
	select {
	case <-armed.Done():
		hit = armed.KilledBy(syscall.SIGKILL)
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	if !hit {
		armed.Stop(syscall.SIGTERM, 25*time.Second)
		s.cpMissed.Add(1)
	}
	if err := sl.startLocked(ctx, nil); err != nil {
		return "", hit, err
	}
	if !hit {
		return fmt.Sprintf("%s armed with %s did not die there (%s); restarted normally", sl.name, spec, armed.Status()), false, nil
	}
	return fmt.Sprintf("%s died at %s, restarted", sl.name, spec), true, nil
}

// stubFault sets the stub's faults for 2 to 5 seconds, then clears them.
func (s *soak) stubFault(ctx context.Context, f smsstub.Faults, what string) (string, bool, error) {
	d := s.uniform(2*time.Second, 5*time.Second)
	f.GenericOnly = s.cfg.provider == providerPair
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := smsstub.PostFaults(actx, s.stub.url, f); err != nil {
		return "", false, err
	}
	_ = sleepCtx(ctx, d)
	cctx, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel2()
	if _, err := smsstub.PostFaults(cctx, s.stub.url, smsstub.Faults{}); err != nil {
		return "", true, err
	}
	return fmt.Sprintf("%s for %s", what, d.Round(time.Millisecond)), true, nil
}

// dbCut cuts the database connections of relays, senders and receiver for
// 1 to 2 seconds: either the proxies are disabled (every connection
// closed, new ones refused) or every connection is reset as soon as it
// carries data.
func (s *soak) dbCut(ctx context.Context) (string, bool, error) {
	d := s.uniform(time.Second, 2*time.Second)
	if s.rng.IntN(2) == 0 {
		for _, p := range s.dbProxies {
			p.disable()
		}
		_ = sleepCtx(ctx, d)
		for _, p := range s.dbProxies {
			if err := p.enable(); err != nil {
				return "", true, err
			}
		}
		return fmt.Sprintf("proxy disabled for %s", d.Round(time.Millisecond)), true, nil
	}
	if err := s.dbToxics(ctx, "soak_db_reset_", "reset_peer", d); err != nil {
		return "", true, err
	}
	return fmt.Sprintf("connections reset for %s", d.Round(time.Millisecond)), true, nil
}

// dbOutage partitions Postgres from the relays, senders and receiver for
// 15 to 35 seconds, longer than the senders' lease: queries and answers
// are dropped and connections hang, as in a network partition. The senders
// must hold what they learned (provider answers, claims whose answer was
// lost) and write it when the database is back; the reconciler, behind the
// same partition, must not mistake them for dead senders.
func (s *soak) dbOutage(ctx context.Context) (string, bool, error) {
	d := s.uniform(15*time.Second, 35*time.Second)
	if err := s.dbToxics(ctx, "soak_db_outage_", "timeout", d); err != nil {
		return "", true, err
	}
	return fmt.Sprintf("postgres partitioned for %s", d.Round(time.Millisecond)), true, nil
}

// dbToxics puts a toxic of typ (timeout 0) on both directions of every
// database proxy for d, then removes them.
func (s *soak) dbToxics(ctx context.Context, prefix, typ string, d time.Duration) error {
	streams := []string{"upstream", "downstream"}
	for _, p := range s.dbProxies {
		for _, stream := range streams {
			if err := p.addToxic(prefix+stream, typ, stream, map[string]any{"timeout": 0}); err != nil {
				return err
			}
		}
	}
	_ = sleepCtx(ctx, d)
	for _, p := range s.dbProxies {
		for _, stream := range streams {
			if err := p.removeToxic(prefix + stream); err != nil {
				return err
			}
		}
	}
	return nil
}
