package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// play plays a sender's part on one row with the statements a sender runs
// (ClaimForSend, ApplyResults) and the attempts-log records it keeps
// (internal/sender/attempt.go): a call is logged unless it is the first
// attempt, sent, of a row never republished (the row describes it); a
// lookup is logged beside the call that follows it; a 429, and a lookup
// that settles the row or fails, give the claim's attempt back.
type play struct {
	t    *testing.T
	pool *pgxpool.Pool
	id   uuid.UUID
	c    outbox.Claim
}

// claim makes the row due and claims it for one attempt.
func (p *play) claim() {
	p.t.Helper()
	exec(p.t, p.pool, `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, p.id)
	p.c = claimOne(p.t, p.pool, p.id, uuid.New())
	if p.c.Result != outbox.Claimed && p.c.Result != outbox.ClaimedStale {
		p.t.Fatalf("claim of %s: %v", p.id, p.c.Result)
	}
}

// die leaves the claim's attempt without an outcome, as a sender killed
// mid-call does: nothing is written, and the lease runs out.
func (p *play) die() {
	exec(p.t, p.pool, `UPDATE sms_outbox SET lease_until = now() - interval '1 hour' WHERE id = $1`, p.id)
}

func (p *play) rec(outcome string) outbox.Attempt {
	return outbox.Attempt{OutboxID: p.id, Number: p.c.Attempt, StartedAt: time.Now(), Outcome: outcome, Sender: "test"}
}

func (p *play) write(r outbox.Result, as ...outbox.Attempt) {
	p.t.Helper()
	r.ID, r.Token = p.id, p.c.Token
	err := pgx.BeginFunc(context.Background(), p.pool, func(tx pgx.Tx) error {
		_, err := outbox.ApplyResults(context.Background(), tx, []outbox.Result{r}, as, false)
		return err
	})
	if err != nil {
		p.t.Fatal(err)
	}
}

// call returns the record of a call with outcome, none for the first
// attempt sent of a row never republished.
func (p *play) call(outcome string) []outbox.Attempt {
	if outcome == "sent" && p.c.Attempt == 1 && p.c.Gen == 0 {
		return nil
	}
	return []outbox.Attempt{p.rec(outcome)}
}

func (p *play) sent() {
	p.write(outbox.Result{Status: outbox.StatusSent, ProviderRef: "msg_" + p.id.String()[:8]}, p.call("sent")...)
}

func (p *play) retry() {
	p.write(outbox.Result{Status: outbox.StatusQueued, Error: "503"}, p.call("retry")...)
}

func (p *play) permanent() {
	p.write(outbox.Result{Status: outbox.StatusDead, Reason: "permanent", Error: "400"}, p.call("permanent")...)
}

// limited is a 429: it spends no attempt when refund is set (as the
// sender asks); without, it charges the attempt nobody made.
func (p *play) limited(refund bool) {
	p.write(outbox.Result{Status: outbox.StatusQueued, Error: "429", Refund: refund}, p.rec("rate_limited"))
}

// unanswered is a lost answer at a provider without idempotency: looked
// up later, or (no lookups) unknown.
func (p *play) unanswered(lookups bool) {
	if lookups {
		p.write(outbox.Result{Status: outbox.StatusQueued, Error: "timeout", MaybeAccepted: true, LookupPending: true}, p.rec("ambiguous"))
		return
	}
	p.write(outbox.Result{Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "timeout", MaybeAccepted: true}, p.rec("ambiguous"))
}

// staleUnknown is a stale claim at a provider without idempotency and
// without lookups: the attempt it took over may have sent the message.
func (p *play) staleUnknown() {
	if p.c.Result != outbox.ClaimedStale {
		p.t.Fatalf("claim of %s is not stale", p.id)
	}
	p.write(outbox.Result{Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "an earlier attempt ended without an outcome", MaybeAccepted: true},
		p.rec("ambiguous"))
}

func (p *play) evidence(result string) *outbox.Evidence {
	return &outbox.Evidence{Kind: "lookup", Result: result, ReceivedAt: time.Now(), Source: "sender"}
}

// lookup asks the provider about the earlier attempts: found settles the
// row sent, several ends it unknown, failed asks again later; each gives
// the claim's attempt back, unless refund is false (the charge this
// oracle is for). none is followed by the call.
func (p *play) lookup(result string, refund bool) {
	switch result {
	case "found":
		p.write(outbox.Result{Status: outbox.StatusSent, ProviderRef: "msg_found", Refund: refund, Lookup: p.evidence(result)}, p.rec("lookup"))
	case "several":
		p.write(outbox.Result{Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "several", MaybeAccepted: true, Refund: refund,
			Lookup: p.evidence(result)}, p.rec("lookup"))
	case "failed":
		p.write(outbox.Result{Status: outbox.StatusQueued, Error: "lookup failed", MaybeAccepted: true, LookupPending: true,
			LookupFailed: true, Refund: refund, Lookup: p.evidence(result)}, p.rec("lookup"))
	default:
		p.t.Fatalf("lookup %q", result)
	}
}

// noneThenSent is a lookup that found nothing, then the call, sent.
func (p *play) noneThenSent() {
	p.write(outbox.Result{Status: outbox.StatusSent, ProviderRef: "msg_after_none", NotAccepted: true, Lookup: p.evidence("none")},
		append([]outbox.Attempt{p.rec("lookup")}, p.call("sent")...)...)
}

// replay is an operator's relay dlq replay -force.
func (p *play) replay() {
	p.t.Helper()
	err := pgx.BeginFunc(context.Background(), p.pool, func(tx pgx.Tx) error {
		res, err := outbox.Replay(context.Background(), tx, []outbox.ReplayTarget{{ID: p.id}}, outbox.ReplayOptions{Force: true})
		if err == nil && !res[0].Replayed {
			p.t.Fatalf("replay of %s refused: %s", p.id, res[0].Refused)
		}
		return err
	})
	if err != nil {
		p.t.Fatal(err)
	}
}

// finalize is the reconciler ending a row whose last attempt died with
// its budget spent: unknown, recorded under that attempt's number.
func (p *play) finalize() {
	p.t.Helper()
	err := pgx.BeginFunc(context.Background(), p.pool, func(tx pgx.Tx) error {
		return outbox.Finalize(context.Background(), tx, outbox.Stuck{ID: p.id, Status: outbox.StatusSending, Attempts: p.c.Attempt},
			outbox.StatusUnknown, "ambiguous", "the last attempt never reported back")
	})
	if err != nil {
		p.t.Fatal(err)
	}
}

// steps are the moves a scenario is written in, each one statement of a
// sender, the reconciler or an operator on the row.
var steps = map[string]func(p *play){
	"claim":    (*play).claim,
	"die":      (*play).die,
	"sent":     (*play).sent,
	"retry":    (*play).retry,
	"400":      (*play).permanent,
	"429":      func(p *play) { p.limited(true) },
	"429-kept": func(p *play) { p.limited(false) },
	// A lost answer, looked up later or (without lookups) unknown.
	"lost":          func(p *play) { p.unanswered(true) },
	"lost-unknown":  func(p *play) { p.unanswered(false) },
	"stale-unknown": (*play).staleUnknown,
	"found":         func(p *play) { p.lookup("found", true) },
	"found-kept":    func(p *play) { p.lookup("found", false) },
	"several":       func(p *play) { p.lookup("several", true) },
	"failed":        func(p *play) { p.lookup("failed", true) },
	"failed-kept":   func(p *play) { p.lookup("failed", false) },
	"none+sent":     (*play).noneThenSent,
	"replay":        (*play).replay,
	"finalize":      (*play).finalize,
	// A permanent failure whose attempt was given back.
	"400-refunded": func(p *play) {
		p.write(outbox.Result{Status: outbox.StatusDead, Reason: "permanent", Error: "400", Refund: true}, p.rec("permanent"))
	},
}

// MiscountedAttempts on rows played through the paths that spend attempts,
// give them back or start them again. The oracle flagged every replayed
// row and every row a lookup settled or a stale claim took over, and let
// through a 429 or a lookup that kept its attempt; each case says what it
// must say.
func TestMiscountedAttempts(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	for _, tt := range []struct {
		name string
		// max is the row's attempt budget (0: the default).
		max        int
		moves      string
		miscounted bool
	}{
		{"sent at once: the row describes the attempt", 0, "claim sent", false},
		{"a retry, then sent", 0, "claim retry claim sent", false},
		{"a refunded 429, then sent at once", 0, "claim 429 claim sent", false},
		{"a retry, a refunded 429, then sent", 0, "claim retry claim 429 claim sent", false},
		{"replayed after a permanent failure, then sent", 0, "claim 400 replay claim sent", false},
		{"replayed after its budget ran out, then sent", 3, "claim retry claim retry claim 400 replay claim sent", false},
		{"replayed twice, a refunded 429 after each", 2,
			"claim retry claim 400 replay claim 429 claim 400 replay claim 429 claim retry claim sent", false},
		{"settled by a lookup that found it", 0, "claim lost claim found", false},
		{"a failed lookup, then one that found it", 0, "claim lost claim failed claim found", false},
		{"a lookup that found several: unknown", 0, "claim lost claim several", false},
		{"a lookup that found none, then sent", 0, "claim lost claim none+sent", false},
		{"replayed unknown, looked up as republished, none, then sent", 0, "claim lost-unknown replay claim none+sent", false},
		{"a stale claim, then sent again under the same key", 0, "claim die claim sent", false},
		{"a retry, a stale claim, then sent", 0, "claim retry claim die claim sent", false},
		{"a stale claim without idempotency: unknown", 0, "claim die claim stale-unknown", false},
		{"a last attempt that died, finalised by the reconciler", 2, "claim retry claim die finalize", false},

		{"a 429 that kept its attempt", 0, "claim 429-kept claim sent", true},
		{"a 429 that kept its attempt after a replay", 0, "claim retry claim 400 replay claim 429-kept claim retry claim sent", true},
		{"a lookup that found it and kept the attempt", 0, "claim lost claim found-kept", true},
		{"a failed lookup that kept its attempt", 0, "claim lost claim failed-kept claim none+sent", true},
		{"a spent attempt given back", 0, "claim retry claim 400-refunded", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := &play{t: t, pool: pool, id: enqueue(t, pool, "+15551234567", "a")}
			if tt.max > 0 {
				exec(t, pool, `UPDATE sms_outbox SET max_attempts = $2 WHERE id = $1`, p.id, tt.max)
			}
			for _, m := range strings.Fields(tt.moves) {
				step, ok := steps[m]
				if !ok {
					t.Fatalf("no move %q", m)
				}
				step(p)
			}
			n, err := outbox.MiscountedAttempts(context.Background(), pool, []uuid.UUID{p.id})
			if err != nil {
				t.Fatal(err)
			}
			if got := n == 1; got != tt.miscounted {
				var count int
				var log string
				if err := pool.QueryRow(context.Background(), `SELECT attempt_count, coalesce((SELECT string_agg(attempt || ':' || outcome, ' ' ORDER BY id)
					FROM sms_attempts WHERE outbox_id = $1), '') FROM sms_outbox WHERE id = $1`, p.id).Scan(&count, &log); err != nil {
					t.Fatal(err)
				}
				t.Errorf("%s: miscounted = %v, want %v (attempt_count %d; log %s)", tt.moves, got, tt.miscounted, count, log)
			}
		})
	}
}
