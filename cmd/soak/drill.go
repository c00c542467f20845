package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/pgserver"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testport"
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
//     replication) that the soak makes with initdb and pg_basebackup; the
//     processes and the writers reach them through one multi-host DSN with
//     target_session_attrs=read-write. The replication link is cut, the
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

	// pg-failover
	gone       map[uuid.UUID]bool // committed on the old primary, lost with it
	statusLost map[string]int     // "sent>queued": status writes the standby never got
	rewound    map[uuid.UUID]bool // rows whose last status write the standby never got
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

// drillWithhold is the share of messages the provider takes without
// answering around a failover at a provider without idempotency.
const drillWithhold = 0.25

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

// pgPair is the primary and the standby of -drill pg-failover.
type pgPair struct {
	dir              string
	primary, standby *pgserver.Server
	link             *tcpProxy // the standby's replication connection goes through it
	db               string
}

// startPGPair makes the primary (database created and migrated), a proxy
// for the replication link, and a streaming standby behind it; the soak's
// database URL becomes the pair's multi-host DSN.
func (s *soak) startPGPair(ctx context.Context) error {
	bin := s.cfg.pgBin
	if bin == "" {
		var err error
		if bin, err = pgserver.FindBin(); err != nil {
			return err
		}
	}
	u, err := url.Parse(s.cfg.databaseURL)
	if err != nil {
		return err
	}
	p := &pgPair{db: strings.TrimPrefix(u.Path, "/")}
	s.pg = p
	if p.dir, err = pgserver.NewDir(""); err != nil {
		return err
	}
	ports := make([]int, 2)
	for i := range ports {
		if ports[i], err = testport.Pick(); err != nil {
			return err
		}
	}
	if p.primary, err = pgserver.Init(ctx, bin, p.dir, "primary", ports[0]); err != nil {
		return err
	}
	if err := p.primary.Start(ctx); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, p.primary.URL("postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{p.db}.Sanitize())
	conn.Close(ctx)
	if err != nil {
		return err
	}
	s.directURL = p.primary.URL(p.db)
	if err := s.migrate(ctx); err != nil {
		return err
	}
	if p.link, err = newTCPProxy("replication", p.primary.Addr()); err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(p.link.addr())
	linkPort, _ := strconv.Atoi(port)
	if p.standby, err = pgserver.BaseBackup(ctx, bin, host, linkPort, p.dir, "standby", ports[1]); err != nil {
		return err
	}
	if err := p.standby.Start(ctx); err != nil {
		return err
	}
	if err := waitUntil(ctx, time.Minute, 200*time.Millisecond, func() bool {
		c, err := pgx.Connect(ctx, p.primary.URL("postgres"))
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		var n int
		_ = c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n)
		return n == 1
	}); err != nil {
		return errors.New("the standby does not stream from the primary")
	}
	// One DSN for every client: the first host that takes writes.
	s.directURL = fmt.Sprintf("postgres://postgres@%s,%s/%s?sslmode=disable&target_session_attrs=read-write",
		p.primary.Addr(), p.standby.Addr(), p.db)
	s.logf("postgres primary %s, streaming standby %s (replication through %s); data in %s",
		p.primary.Addr(), p.standby.Addr(), p.link.addr(), p.dir)
	return nil
}

func (p *pgPair) stop(keep bool, logf func(string, ...any)) {
	for _, srv := range []*pgserver.Server{p.primary, p.standby} {
		if srv != nil {
			srv.StopQuietly()
		}
	}
	if p.link != nil {
		p.link.close()
	}
	if keep {
		logf("postgres data and logs kept in %s", p.dir)
		return
	}
	_ = os.RemoveAll(p.dir)
}

// drillFailover cuts the replication link, crashes the primary 2s later,
// records what the standby holds, promotes it, and times the recovery; at
// the end (failoverLosses) it compares with what the old primary held.
func (s *soak) drillFailover(ctx context.Context) error {
	p := s.pg
	if s.lookups() {
		// Ambiguous calls in flight across the failover: from a few
		// seconds before the link is cut until the promotion, the
		// provider, still slow, takes a share of the messages and never
		// answers (the senders give up at their timeout, 10s by default).
		// Their claims, and what the senders write of them, may be lost
		// with the old primary.
		if err := s.setStubFaults(ctx, smsstub.Faults{Latency: drillLatency, WithholdRate: drillWithhold, WithholdMode: smsstub.WithholdHang}); err != nil {
			return err
		}
		_ = sleepCtx(ctx, 3*time.Second)
	}
	p.link.disable()
	cut := time.Now()
	_ = sleepCtx(ctx, 2*time.Second)
	if err := p.primary.Crash(ctx); err != nil {
		return err
	}
	crashed := time.Now()
	s.faults.add("pg_failover")
	s.logf("DRILL pg-failover: replication link cut, primary crashed %s later", crashed.Sub(cut).Round(time.Millisecond))
	// The standby, read-only, holds what will survive.
	snap, err := rowStatuses(ctx, p.standby.URL(p.db))
	if err != nil {
		return fmt.Errorf("read the standby: %w", err)
	}
	if err := p.standby.Promote(ctx); err != nil {
		return err
	}
	promoted := time.Now()
	if err := s.setStubFaults(ctx, smsstub.Faults{}); err != nil {
		return err
	}
	if s.lookups() {
		st, err := smsstub.FetchStats(ctx, s.stub.url)
		if err != nil {
			return err
		}
		s.drill.note("replication cut, primary crashed 2s later, standby promoted %s after the crash (the provider slowed to %s until then, and from 3s before the cut took %.0f%% of the messages without answering: %d calls in flight lost their answer)",
			promoted.Sub(crashed).Round(100*time.Millisecond), drillLatency, 100*drillWithhold, st.Withheld)
	} else {
		s.drill.note("replication cut, primary crashed 2s later, standby promoted %s after the crash (the provider slowed to %s until then)",
			promoted.Sub(crashed).Round(100*time.Millisecond), drillLatency)
	}

	// The old primary, started alone on a port of its own, says what was
	// lost with it.
	oldPort, err := testport.Pick()
	if err != nil {
		return err
	}
	old := *p.primary
	old.Port = oldPort
	if err := old.Start(ctx); err != nil {
		return fmt.Errorf("start the old primary to read it: %w", err)
	}
	was, err := rowStatuses(ctx, old.URL(p.db))
	old.StopQuietly()
	if err != nil {
		return fmt.Errorf("read the old primary: %w", err)
	}
	s.drill.gone, s.drill.statusLost, s.drill.rewound = map[uuid.UUID]bool{}, map[string]int{}, map[uuid.UUID]bool{}
	for id, st := range was {
		now, ok := snap[id]
		switch {
		case !ok:
			s.drill.gone[id] = true
		case now != st:
			s.drill.statusLost[st+">"+now]++
			s.drill.rewound[id] = true
		}
	}
	lostWrites := 0
	for _, n := range s.drill.statusLost {
		lostWrites += n
	}
	s.drill.note("lost with the primary: %d inserts and %d status writes (%s)", len(s.drill.gone), lostWrites, formatTransitions(s.drill.statusLost))
	return s.timeRecovery(ctx, promoted, "the promotion")
}

// failoverNotes adds, after the check, how the rows the failover touched
// ended: inserts lost with the primary the provider had already delivered
// (the application's own transaction is lost with them: asynchronous
// replication's price), and rows whose status writes were lost.
func (s *soak) failoverNotes(deliveries map[string]smsstub.Delivery) {
	if s.drill == nil || s.drill.gone == nil {
		return
	}
	delivered := 0
	for id := range s.drill.gone {
		if deliveries[id.String()].Deliveries > 0 {
			delivered++
		}
	}
	s.drill.note("of the %d lost inserts the provider had delivered %d before the crash (their rows are gone with the application's transactions)", len(s.drill.gone), delivered)
	if s.lookups() {
		twice := 0
		for id := range s.drill.rewound {
			if deliveries[id.String()].Deliveries > 1 {
				twice++
			}
		}
		s.drill.note("at a provider without idempotency, with lookups: of the %d rows whose status write was lost, %d were delivered twice", len(s.drill.rewound), twice)
	}
}

// rowStatuses reads every row's status from the database at dsn.
func rowStatuses(ctx context.Context, dsn string) (map[uuid.UUID]string, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(cctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(cctx)
	rows, _ := conn.Query(cctx, `SELECT id, status FROM sms_outbox`)
	out := map[uuid.UUID]string{}
	var id uuid.UUID
	var st string
	_, err = pgx.ForEachRow(rows, []any{&id, &st}, func() error { out[id] = st; return nil })
	return out, err
}

func formatTransitions(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s back to %s %d", strings.Split(k, ">")[0], strings.Split(k, ">")[1], m[k])
	}
	return strings.Join(parts, ", ")
}
