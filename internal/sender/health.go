package sender

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/sendonce/sendonce/internal/telemetry"
)

// health is the sender's record of its own progress, for Ready. The loops
// update it with one call each (see the hooks in sender.go); nothing here
// calls Postgres or NATS.
type health struct {
	// consuming is set once Run has started consuming.
	consuming atomic.Bool
	fetches   telemetry.Activity
	claims    telemetry.Activity
	// waitingSince is when the oldest fetched message not yet taken by a
	// claim arrived (unix nanoseconds, 0: none waiting).
	waitingSince atomic.Int64
	// holding is set while the claim loop waits for a token of the shared
	// rate limit (or a provider's pause): messages then wait on purpose.
	holding atomic.Bool
}

// throttled records that the claim loop waits for a token (on), or has one
// (off); a wait restarts the waiting-message clock when it ends.
func (h *health) throttled(on bool) {
	h.holding.Store(on)
	if !on {
		h.waitingSince.Store(0)
	}
}

// started records that Run is consuming.
func (h *health) started() { h.consuming.Store(true) }

// fetched records a message fetched from JetStream.
func (h *health) fetched() {
	h.fetches.OK()
	h.waitingSince.CompareAndSwap(0, time.Now().UnixNano())
}

// pulled records a pull the server answered, with messages or without.
func (h *health) pulled() { h.fetches.OK() }

// fetchFailed records a failed fetch (no heartbeat from the server, a
// broken connection).
func (h *health) fetchFailed() { h.fetches.Fail() }

// taken records that the claim loop took the waiting messages.
func (h *health) taken() { h.waitingSince.Store(0) }

// claimed records a claim round trip that succeeded.
func (h *health) claimed() { h.claims.OK() }

// claimFailed records a claim that failed (the database).
func (h *health) claimFailed() { h.claims.Fail() }

// Ready reports whether the sender is doing its work, from its own progress
// only (a probe that pinged Postgres or NATS would make every sender
// unready at once during a failover or a leader election, and say nothing of
// a stuck loop): nil unless Run has not started, fetches or claims have
// failed for longer than stall, or a fetched message has waited longer than
// stall for a claim. An idle sender is ready. stall should exceed the time
// a message may wait for a free slot, about the lease.
func (s *Sender) Ready(stall time.Duration) error {
	h := &s.health
	now := time.Now()
	if !h.consuming.Load() {
		return errors.New("not consuming yet")
	}
	if err := h.fetches.Failing("fetch from jetstream", now, stall); err != nil {
		return err
	}
	if err := h.claims.Failing("claim in postgres", now, stall); err != nil {
		return err
	}
	if since := h.waitingSince.Load(); since != 0 && !h.holding.Load() && now.Sub(time.Unix(0, since)) > stall {
		return errors.New("claim loop: a fetched message has waited " + now.Sub(time.Unix(0, since)).Round(time.Second).String() + " for a claim")
	}
	return nil
}
