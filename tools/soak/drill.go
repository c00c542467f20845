package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
)

// A drill replaces the random faults with one scripted failure, timed, with
// the relays and senders on their default settings (so the times are the
// ones a deployment that changed nothing would see):
//
//   - store-loss: the NATS server (every node with -cluster) is killed, its
//     JetStream store deleted, and it is started again empty. The running
//     processes recreate the topology; the relay publishes pending rows
//     again; the reconciler republishes the rows whose messages were lost
//     with the store (queued, not yet sent).
//   - pg-failover: Postgres is a primary and a streaming standby (asynchronous
//     replication) that the soak makes with initdb and pg_basebackup (see
//     pgPair); the processes and the writers reach them through one
//     multi-host DSN with target_session_attrs=read-write (the processes
//     over a proxy per server). The replication link is cut, the
//     primary crashes 2s later, the standby is promoted. What the standby
//     never received is lost: inserts, and status writes (a sent row is
//     queued again, a queued one pending). The relay and the reconciler move
//     those rows again, with the same idempotency key: an idempotent provider
//     answers with its stored response, and nothing is sent twice.
type drill struct {
	kind string
	at   time.Duration // since the soak's start
	// before are the rows committed before the failure; they are the ones
	// whose recovery is timed.
	before []uuid.UUID
	notes  []string // what was measured, in order
}

func (d *drill) note(format string, args ...any) {
	d.notes = append(d.notes, fmt.Sprintf(format, args...))
}

// line is the drill's verdict line, printed after the soak's.
func (d *drill) line() string {
	return fmt.Sprintf("drill %s at %s: %s", d.kind, clock(d.at), strings.Join(d.notes, "; "))
}

// drillLoop waits until the drill's share of the rows is committed, then
// runs the drill.
func (s *soak) drillLoop(ctx context.Context) {
	want := int(float64(s.cfg.rows) * s.cfg.drillAt)
	for s.load.committed() < want {
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
	s.drill = &drill{kind: s.cfg.drill, at: time.Since(s.start), before: s.load.committedIDs()}
	var err error
	switch s.cfg.drill {
	case "store-loss":
		err = s.drillStoreLoss(ctx)
	case "pg-failover":
		err = s.drillFailover(ctx)
	}
	if err != nil {
		s.drill.note("FAILED: %v", err)
		s.logf("drill %s: %v", s.cfg.drill, err)
	}
}

// drillLatency is the stub's latency before a drill's failure: the three
// senders' 96 attempts in flight then finish about 190 rows a second, below
// the load's 250, and a backlog builds.
const drillLatency = 500 * time.Millisecond

func (s *soak) setStubFaults(ctx context.Context, f smsstub.Faults) error {
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := smsstub.PostFaults(fctx, s.stub.url, f)
	return err
}

// drillStoreLoss kills NATS, deletes its store, starts it empty and times
// the recovery.
func (s *soak) drillStoreLoss(ctx context.Context) error {
	counts, _ := s.statusCounts(ctx)
	if s.cluster != nil {
		for _, n := range s.cluster.Nodes() {
			if err := n.Kill(); err != nil {
				return err
			}
		}
		for _, n := range s.cluster.Nodes() {
			if err := n.WipeStore(); err != nil {
				return err
			}
		}
		if err := s.restoreNATS(ctx); err != nil {
			return err
		}
	} else {
		s.broker.stop()
		if err := os.RemoveAll(s.broker.dir); err != nil {
			return err
		}
		if err := s.broker.start(); err != nil {
			return err
		}
	}
	back := time.Now()
	if err := s.setStubFaults(ctx, smsstub.Faults{}); err != nil {
		return err
	}
	s.faults.add("store_loss")
	s.logf("DRILL store-loss: NATS killed, store deleted, started empty (rows then: %d queued, %d pending, %d sending)",
		counts["queued"], counts["pending"], counts["sending"])
	s.drill.note("NATS restarted on an empty store with %d rows queued, %d pending, %d sending (the provider slowed to %s until then)",
		counts["queued"], counts["pending"], counts["sending"], drillLatency)

	nc, err := nats.Connect(s.natsURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := waitUntil(ctx, 5*time.Minute, 100*time.Millisecond, func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := js.Consumer(cctx, streams.Stream, streams.Consumer)
		return err == nil
	}); err != nil {
		return errors.New("the processes did not recreate the topology within 5 minutes")
	}
	s.drill.note("topology recreated after %s", since(back))
	return s.timeRecovery(ctx, back, "the restart")
}

// timeRecovery notes when rows are sent again after from, and when every row
// committed before the drill (and still in the table) is finished.
func (s *soak) timeRecovery(ctx context.Context, from time.Time, event string) error {
	base := s.countSent(ctx)
	if err := waitUntil(ctx, 10*time.Minute, 100*time.Millisecond, func() bool { return s.countSent(ctx) > base }); err != nil {
		return fmt.Errorf("nothing sent within 10 minutes of %s", event)
	}
	s.drill.note("rows sent again after %s", since(from))
	var open int
	err := waitUntil(ctx, s.cfg.drainTimeout, time.Second, func() bool {
		open = s.openAmong(ctx, s.drill.before)
		return open == 0
	})
	if err != nil {
		s.drill.note("%d rows committed before it still not finished after %s", open, since(from))
		return nil
	}
	var republished int
	_ = s.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE id = ANY($1) AND publish_gen > 0`, s.drill.before).Scan(&republished)
	s.drill.note("every row committed before it finished %s after %s (%d republished by the reconciler)", since(from), event, republished)
	return nil
}

// countSent counts the rows the provider took: sent, and settled by a
// receipt or a lookup.
func (s *soak) countSent(ctx context.Context) int {
	var n int
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.pool.QueryRow(qctx, `SELECT count(*) FROM sms_outbox WHERE status IN ('sent', 'delivered', 'undelivered')`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// openAmong counts the rows of ids that exist and are not finished.
func (s *soak) openAmong(ctx context.Context, ids []uuid.UUID) int {
	var n int
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := s.pool.QueryRow(qctx, `SELECT count(*) FROM sms_outbox WHERE id = ANY($1) AND status NOT IN ('sent', 'dead', 'unknown', 'delivered', 'undelivered')`, ids).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }

// waitUntil polls cond every step until it holds, ctx ends or d passes.
func waitUntil(ctx context.Context, d, step time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		if err := sleepCtx(ctx, step); err != nil {
			return err
		}
	}
	return nil
}

// drillFailover runs one failover (see soak.failover: at a provider
// without idempotency, with calls in flight across it), notes what the old
// primary took with it, and times the recovery; at the end
// (failoverNotes) it adds how the rows it touched ended.
func (s *soak) drillFailover(ctx context.Context) error {
	// The provider, slowed before the failure, stays slow until the
	// promotion.
	f, promoted, err := s.failover(ctx, smsstub.Faults{Latency: drillLatency})
	if promoted {
		s.faults.add("pg_failover")
	}
	if err != nil {
		return err
	}
	if s.lookups() {
		s.drill.note("replication cut, primary crashed 2s later, standby promoted %s after the crash (the provider slowed to %s until then, and from 3s before the cut took %.0f%% of the messages without answering: %d calls in flight lost their answer)",
			f.promoteAfter.Round(100*time.Millisecond), drillLatency, 100*failoverShare, f.withheld)
	} else {
		s.drill.note("replication cut, primary crashed 2s later, standby promoted %s after the crash (the provider slowed to %s until then)",
			f.promoteAfter.Round(100*time.Millisecond), drillLatency)
	}
	s.drill.note("lost with the primary: %d inserts and %d status writes (%s)", f.gone, f.writes, formatTransitions(f.transitions))
	return s.timeRecovery(ctx, f.promotedAt, "the promotion")
}

// failoverNotes adds, after the check, how the rows the failover touched
// ended: inserts lost with the primary the provider had already delivered
// (the application's own transaction is lost with them: asynchronous
// replication's price), and rows whose status writes were lost.
func (s *soak) failoverNotes(deliveries map[string]smsstub.Delivery) {
	if s.drill == nil || s.pgLost == nil || s.pgLost.failovers == 0 {
		return
	}
	l := s.pgLost
	delivered := 0
	for id := range l.gone {
		if deliveries[id.String()].Deliveries > 0 {
			delivered++
		}
	}
	s.drill.note("of the %d lost inserts the provider had delivered %d before the crash (their rows are gone with the application's transactions)", len(l.gone), delivered)
	if s.lookups() {
		twice := 0
		for id := range l.rewound {
			if deliveries[id.String()].Deliveries > 1 {
				twice++
			}
		}
		s.drill.note("at a provider without idempotency, with lookups: of the %d rows whose status write was lost, %d were delivered twice", len(l.rewound), twice)
	}
}
