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

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/pgserver"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// pgPair is Postgres as a primary and a streaming standby (asynchronous
// replication) that the soak makes with initdb and pg_basebackup, for the
// failover drill and the pg_failover fault.
//
// Each of the two nodes keeps its port for the whole run and has a proxy in
// front of it, which the relays, senders and receiver go through (so that
// db_cut and db_outage reach them whichever node is the primary); they, the
// writers and the checks find the primary with one multi-host DSN with
// target_session_attrs=read-write. A failover promotes the standby; the
// node of the old primary then gets a new standby, made from the promoted
// one, so that the fault can come again with the roles swapped.
type pgPair struct {
	bin   string
	dir   string // holds every data directory and server log
	db    string
	nodes [2]pgNode
	// primary is the index in nodes of the primary; the other node is the
	// standby while it has a server.
	primary int
	// link is the proxy the standby's replication connection goes through,
	// so that it can be cut; nil while there is no standby.
	link *tcpProxy
	// made counts the data directories made, to name the next.
	made int
	// old are the crashed primaries, kept (data and logs) until the end.
	old []*pgserver.Server
}

// pgNode is one of the pair's two servers.
type pgNode struct {
	port  int
	srv   *pgserver.Server // nil while the node has no server
	proxy *tcpProxy        // in front of port
}

func (p *pgPair) primaryServer() *pgserver.Server { return p.nodes[p.primary].srv }

func (p *pgPair) standbyServer() *pgserver.Server { return p.nodes[1-p.primary].srv }

// proxies are the proxies in front of the nodes.
func (p *pgPair) proxies() []*tcpProxy { return []*tcpProxy{p.nodes[0].proxy, p.nodes[1].proxy} }

// multiHost is a DSN of the pair's database over addrs (one per node):
// the first that takes writes.
func (p *pgPair) multiHost(addrs ...string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(addrs, ","), p.db)
}

// startPGPair makes the primary (database created and migrated), a proxy in
// front of each node, and a streaming standby; the soak's direct database
// URL becomes the pair's multi-host DSN, and its proxied one the same over
// the proxies.
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
	p := &pgPair{bin: bin, db: strings.TrimPrefix(u.Path, "/")}
	s.pg, s.pgLost = p, newPGLosses()
	if p.dir, err = pgserver.NewDir(""); err != nil {
		return err
	}
	for i := range p.nodes {
		n := &p.nodes[i]
		if n.port, err = testport.Pick(); err != nil {
			return err
		}
		if n.proxy, err = newTCPProxy(fmt.Sprintf("postgres-%d", i+1), net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))); err != nil {
			return err
		}
	}
	p.made++
	primary, err := pgserver.Init(ctx, bin, p.dir, fmt.Sprintf("node-%d", p.made), p.nodes[0].port)
	if err != nil {
		return err
	}
	p.nodes[0].srv = primary
	if err := primary.Start(ctx); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to the new primary: %w", err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{p.db}.Sanitize())
	conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("create database %s: %w", p.db, err)
	}
	s.directURL = primary.URL(p.db)
	if err := s.migrate(ctx); err != nil {
		return err
	}
	if err := p.makeStandby(ctx); err != nil {
		return err
	}
	s.directURL = p.multiHost(primary.Addr(), p.standbyServer().Addr())
	s.proxiedURL = p.multiHost(p.nodes[0].proxy.addr(), p.nodes[1].proxy.addr())
	s.dbProxies = p.proxies()
	s.logf("postgres primary %s, streaming standby %s (replication through %s), via proxies %s and %s; data in %s",
		primary.Addr(), p.standbyServer().Addr(), p.link.addr(), p.nodes[0].proxy.addr(), p.nodes[1].proxy.addr(), p.dir)
	return nil
}

// makeStandby makes a streaming standby of the primary on the other node:
// a proxy for the replication link, pg_basebackup through it, and waits
// until it streams.
func (p *pgPair) makeStandby(ctx context.Context) error {
	primary := p.primaryServer()
	node := &p.nodes[1-p.primary]
	if node.srv != nil {
		return errors.New("the standby's node has a server already")
	}
	if p.link != nil {
		p.link.close()
		p.link = nil
	}
	link, err := newTCPProxy("replication", primary.Addr())
	if err != nil {
		return err
	}
	p.link = link
	host, port, _ := net.SplitHostPort(link.addr())
	linkPort, _ := strconv.Atoi(port)
	p.made++
	standby, err := pgserver.BaseBackup(ctx, p.bin, host, linkPort, p.dir, fmt.Sprintf("node-%d", p.made), node.port)
	if err != nil {
		return err
	}
	if err := standby.Start(ctx); err != nil {
		return err
	}
	node.srv = standby
	if err := waitUntil(ctx, time.Minute, 200*time.Millisecond, func() bool {
		c, err := pgx.Connect(ctx, primary.URL("postgres"))
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
	return nil
}

// stop stops the servers and closes the proxies; the data directories and
// logs are kept when keep is set.
func (p *pgPair) stop(keep bool, logf func(string, ...any)) {
	for _, n := range p.nodes {
		if n.srv != nil {
			n.srv.StopQuietly()
		}
		if n.proxy != nil {
			n.proxy.close()
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

// failoverShare is the share of messages the provider takes without
// answering around a failover at a provider without idempotency.
const failoverShare = 0.25

// pgLosses is what the old primaries took with them, failover after
// failover: the check does not count it against the pipeline. Written by
// the fault loop (or the drill) only, read once it ended.
type pgLosses struct {
	failovers int
	// gone: rows committed on an old primary that the promoted standby
	// never had (the application's transaction is lost with them).
	gone map[uuid.UUID]bool
	// statusLost counts the status writes the promoted standby never got,
	// by "old>new" status.
	statusLost map[string]int
	// rewound: rows whose last status write the promoted standby never got.
	rewound map[uuid.UUID]bool
	// receipts: rows an old primary held delivered or undelivered that the
	// promoted standby did not: a receipt the receiver acknowledged and
	// wrote there only. The provider does not send it again, so the row
	// stays sent (until an overdue-receipt sweep asks).
	receipts map[uuid.UUID]bool
}

// failover is what one failover did.
type failover struct {
	promoteAfter time.Duration // from the crash to the promotion
	promotedAt   time.Time
	withheld     int64 // answers the provider withheld meanwhile
	gone, writes int   // inserts and status writes lost
	transitions  map[string]int
	receipts     int // receipts lost
}

// describe says what the failover did, for a fault's log line.
func (f *failover) describe() string {
	return fmt.Sprintf("%d answers withheld, replication cut, the primary crashed 2s later, the standby promoted %s after; lost with the primary: %d inserts, %d status writes (%s), %d receipts",
		f.withheld, f.promoteAfter.Round(100*time.Millisecond), f.gone, f.writes, formatTransitions(f.transitions), f.receipts)
}

// failover cuts the replication link, crashes the primary 2s later,
// records what the standby holds, promotes it and, reading the old primary
// alone on a port of its own, adds what was lost with it to s.pgLost. At a
// provider without idempotency, from 3s before the cut until the
// promotion, the provider takes failoverShare of the messages and never
// answers (calls in flight across the failover; base are the stub's faults
// besides, restored to none after the promotion). promoted reports whether
// the standby took over (and a new one is due).
func (s *soak) failover(ctx context.Context, base smsstub.Faults) (f *failover, promoted bool, err error) {
	p := s.pg
	if p.standbyServer() == nil {
		return nil, false, errors.New("no standby")
	}
	before, err := s.stubStats(ctx)
	if err != nil {
		return nil, false, err
	}
	if s.lookups() {
		// Their claims, and what the senders write of them, may be lost
		// with the old primary.
		withhold := base
		withhold.WithholdRate, withhold.WithholdMode = failoverShare, smsstub.WithholdHang
		if err := s.setStubFaults(ctx, withhold); err != nil {
			return nil, false, err
		}
		_ = sleepCtx(ctx, 3*time.Second)
	}
	p.link.disable()
	cut := time.Now()
	_ = sleepCtx(ctx, 2*time.Second)
	old := p.primaryServer()
	if err := old.Crash(ctx); err != nil {
		return nil, false, fmt.Errorf("crash the primary: %w", err)
	}
	crashed := time.Now()
	s.logf("pg_failover: replication link cut, primary %s crashed %s later", old.Addr(), crashed.Sub(cut).Round(time.Millisecond))
	// The standby, read-only, holds what will survive.
	snap, err := rowStatuses(ctx, p.standbyServer().URL(p.db))
	if err != nil {
		return nil, false, fmt.Errorf("read the standby: %w", err)
	}
	if err := p.standbyServer().Promote(ctx); err != nil {
		return nil, false, fmt.Errorf("promote the standby: %w", err)
	}
	f = &failover{promotedAt: time.Now(), transitions: map[string]int{}}
	f.promoteAfter = f.promotedAt.Sub(crashed)
	p.old = append(p.old, old)
	p.nodes[p.primary].srv = nil
	p.primary = 1 - p.primary
	p.link.close()
	p.link = nil
	if err := s.setStubFaults(ctx, smsstub.Faults{}); err != nil {
		return f, true, err
	}
	after, err := s.stubStats(ctx)
	if err != nil {
		return f, true, err
	}
	f.withheld = after.Withheld - before.Withheld

	// The old primary, started alone on a port of its own, says what was
	// lost with it.
	port, err := testport.Pick()
	if err != nil {
		return f, true, err
	}
	alone := *old
	alone.Port = port
	if err := alone.Start(ctx); err != nil {
		return f, true, fmt.Errorf("start the old primary to read it: %w", err)
	}
	was, err := rowStatuses(ctx, alone.URL(p.db))
	alone.StopQuietly()
	if err != nil {
		return f, true, fmt.Errorf("read the old primary: %w", err)
	}
	l := s.pgLost
	l.failovers++
	for id, st := range was {
		now, ok := snap[id]
		switch {
		case !ok:
			l.gone[id] = true
			f.gone++
		case now != st:
			l.statusLost[st+">"+now]++
			f.transitions[st+">"+now]++
			l.rewound[id] = true
			f.writes++
			if st == "delivered" || st == "undelivered" {
				l.receipts[id] = true
				f.receipts++
			}
		}
	}
	return f, true, nil
}

func newPGLosses() *pgLosses {
	return &pgLosses{gone: map[uuid.UUID]bool{}, statusLost: map[string]int{}, rewound: map[uuid.UUID]bool{}, receipts: map[uuid.UUID]bool{}}
}

// pgFailover is the pg_failover fault: a failover with calls in flight, as
// the drill's, then a new standby made from the promoted primary (on the
// old primary's node), so that the fault can come again.
func (s *soak) pgFailover(ctx context.Context) (string, bool, error) {
	if s.pg == nil || s.pg.standbyServer() == nil {
		return "no standby to promote", false, nil
	}
	f, promoted, err := s.failover(ctx, smsstub.Faults{})
	if err != nil {
		if promoted {
			// Still a failover; the next finds no standby.
			return "", true, fmt.Errorf("after the promotion: %w", err)
		}
		return "", false, err
	}
	began := time.Now()
	if err := s.pg.makeStandby(ctx); err != nil {
		return "", true, fmt.Errorf("a new standby: %w", err)
	}
	return fmt.Sprintf("%s; a new standby streams from it %s later", f.describe(), since(began)), true, nil
}

// failoverLine is the soak's second line after random failovers: what the
// old primaries took with them, and how those rows ended (leftSent: rows
// left sent because their receipt was lost).
func (s *soak) failoverLine(deliveries map[string]smsstub.Delivery, leftSent int) string {
	l := s.pgLost
	writes, delivered, twice := 0, 0, 0
	for _, n := range l.statusLost {
		writes += n
	}
	for id := range l.gone {
		if deliveries[id.String()].Deliveries > 0 {
			delivered++
		}
	}
	for id := range l.rewound {
		if deliveries[id.String()].Deliveries > 1 {
			twice++
		}
	}
	return fmt.Sprintf("pg_failover: %d failovers; lost with the old primaries: %d inserts (%d of them delivered before the crash), %d status writes (%s), of whose rows %d were delivered twice; %d receipts (%d of their rows left sent)",
		l.failovers, len(l.gone), delivered, writes, formatTransitions(l.statusLost), twice, len(l.receipts), leftSent)
}

func (s *soak) stubStats(ctx context.Context) (smsstub.Stats, error) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return smsstub.FetchStats(sctx, s.stub.url)
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
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		from, to, _ := strings.Cut(k, ">")
		parts[i] = fmt.Sprintf("%s back to %s %d", from, to, m[k])
	}
	return strings.Join(parts, ", ")
}
