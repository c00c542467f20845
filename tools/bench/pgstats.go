package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// pgSample is the bench database's activity counters (pg_stat_database)
// and the server's WAL counters (pg_stat_wal, shared with every other
// database on the server).
type pgSample struct {
	at                                     time.Time
	commits, rollbacks, inserted, updated  int64
	walRecords, walFPI, walBytes, walSyncs int64
	// otherCommits is the commits of every other database on the server:
	// work that is not the bench's yet shares its WAL and CPU.
	otherCommits int64
	// lsn is the WAL flushed so far, dbOID the bench database's oid.
	lsn   string
	dbOID uint32
	// polls is the bench's polling queries so far.
	polls int64
	ok    bool
}

// samplePG reads the counters. Backends publish theirs at most once a
// second and when they exit, so the end sample is taken after the relay and
// senders have stopped.
func (b *bench) samplePG(ctx context.Context) pgSample {
	b.holdWAL(ctx)
	return b.readPG(ctx)
}

// readPG reads the counters for the end of a window.
func (b *bench) readPG(ctx context.Context) pgSample {
	s := pgSample{at: time.Now(), polls: b.polls.Load()}
	if _, err := b.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return s
	}
	err := b.pool.QueryRow(ctx, `SELECT d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated,
			w.wal_records, w.wal_fpi, w.wal_bytes::bigint, w.wal_sync,
			(SELECT coalesce(sum(o.xact_commit), 0)::bigint FROM pg_stat_database o WHERE o.datname IS DISTINCT FROM current_database()),
			pg_current_wal_flush_lsn()::text, d.datid
		FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()`).
		Scan(&s.commits, &s.rollbacks, &s.inserted, &s.updated, &s.walRecords, &s.walFPI, &s.walBytes, &s.walSyncs, &s.otherCommits,
			&s.lsn, &s.dbOID)
	s.ok = err == nil
	return s
}

// pgActivity is what Postgres did over a scenario, per message.
type pgActivity struct {
	// Commits is how many transactions committed in the bench database,
	// less the bench's own polling queries (BenchPolls), CommitsPerMsg the
	// same per message.
	Commits       int64   `json:"commits"`
	CommitsPerMsg float64 `json:"commits_per_msg"`
	BenchPolls    int64   `json:"bench_polls"`
	// RowsUpdated and RowsInserted count row writes (outbox and attempts).
	RowsUpdated  int64 `json:"rows_updated"`
	RowsInserted int64 `json:"rows_inserted"`
	// WALBytesPerMsg and WALRecordsPerMsg are the WAL written per message
	// for the bench database (WALSource says how they were told apart from
	// the other databases' WAL).
	WALBytesPerMsg   float64 `json:"wal_bytes_per_msg"`
	WALRecordsPerMsg float64 `json:"wal_records_per_msg"`
	WALSource        string  `json:"wal_source"`
	// WALByRelation splits the bench database's WAL per message by the
	// relation a record touches, largest first ("commits and other" for
	// the records that touch none, such as the commits): where the WAL
	// goes, which the totals do not say. Only with pg_walinspect.
	WALByRelation []relationWAL `json:"wal_by_relation,omitempty"`
	// ServerWALBytesPerMsg and ServerWALRecordsPerMsg are the whole
	// server's WAL per message (pg_stat_wal), other databases included.
	ServerWALBytesPerMsg   float64 `json:"server_wal_bytes_per_msg"`
	ServerWALRecordsPerMsg float64 `json:"server_wal_records_per_msg"`
	// WALSyncs counts WAL flushes to disk (one per commit not grouped with
	// another), WALFullPages the full-page images written.
	WALSyncs     int64 `json:"wal_syncs"`
	WALFullPages int64 `json:"wal_full_page_images"`
	// CPUMicrosPerMsg is the CPU time of the Postgres server (its shared
	// processes and the backends of the bench database) per message, in
	// microseconds, over the scenario's CPU window.
	CPUMicrosPerMsg float64 `json:"cpu_us_per_msg"`
	// OtherDBCommits counts the commits of other databases on the server
	// meanwhile; when it is large, the WAL and CPU figures include their
	// work.
	OtherDBCommits int64 `json:"other_db_commits"`
	// Note says where the counters come from.
	Note string `json:"note"`
}

func (s pgSample) since(start pgSample, msgs int) *pgActivity {
	if !s.ok || !start.ok || msgs <= 0 {
		return nil
	}
	n := float64(msgs)
	polls := s.polls - start.polls
	commits := max(0, s.commits-start.commits-polls)
	return &pgActivity{
		Commits: commits, CommitsPerMsg: float64(commits) / n, BenchPolls: polls,
		RowsUpdated: s.updated - start.updated, RowsInserted: s.inserted - start.inserted,
		WALBytesPerMsg: float64(s.walBytes-start.walBytes) / n, WALRecordsPerMsg: float64(s.walRecords-start.walRecords) / n,
		ServerWALBytesPerMsg: float64(s.walBytes-start.walBytes) / n, ServerWALRecordsPerMsg: float64(s.walRecords-start.walRecords) / n,
		WALSource: "pg_stat_wal: the whole server",
		WALSyncs:  s.walSyncs - start.walSyncs, WALFullPages: s.walFPI - start.walFPI,
		// A database dropped meanwhile takes its counters with it.
		OtherDBCommits: max(0, s.otherCommits-start.otherCommits),
		Note:           "commits: the bench database's, less the bench's polling queries; rows: the bench database's (polling included); WAL: see wal_source; CPU: the server's shared processes and the bench database's backends",
	}
}

// endPG stops the scenario's processes (their backends publish their
// counters as they exit) and returns Postgres's activity since pg0.
func (b *bench) endPG(ctx context.Context, tag string, pg0 pgSample, msgs int) *pgActivity {
	b.stopAll()
	time.Sleep(300 * time.Millisecond) // the backends exit just after their clients
	pg1 := b.readPG(ctx)
	a := pg1.since(pg0, msgs)
	if a != nil {
		rels, err := b.databaseWAL(ctx, pg0, pg1)
		b.releaseWAL()
		if err == nil {
			var recs, bytes int64
			for _, r := range rels {
				recs, bytes = recs+r.records, bytes+r.bytes
			}
			a.WALRecordsPerMsg, a.WALBytesPerMsg = float64(recs)/float64(msgs), float64(bytes)/float64(msgs)
			a.WALSource = "pg_walinspect: the records of the bench database's relations and of its transactions"
			a.WALByRelation = perMessage(rels, msgs)
		} else {
			b.logf("[%s] WAL of the bench database alone unknown (%v): the figures are the whole server's", tag, err)
		}
		b.logf("[%s] postgres: %.2f commits, %.2f row updates, %.1f WAL records, %.0f WAL bytes per message; %d WAL syncs",
			tag, a.CommitsPerMsg, float64(a.RowsUpdated)/float64(msgs), a.WALRecordsPerMsg, a.WALBytesPerMsg, a.WALSyncs)
		if len(a.WALByRelation) > 0 {
			b.logf("[%s] postgres: WAL bytes per message by relation: %s", tag, walSplit(a.WALByRelation))
		}
	}
	return a
}

// finishPG is endPG with the Postgres CPU per message from cpu, the
// scenario's CPU window.
func (b *bench) finishPG(ctx context.Context, tag string, pg0 pgSample, cpu cpuSplit, msgs int) *pgActivity {
	a := b.endPG(ctx, tag, pg0, msgs)
	if a != nil {
		a.CPUMicrosPerMsg = cpu.Cores["postgres"] * cpu.Seconds / float64(msgs) * 1e6
		b.logf("[%s] postgres: %.0f µs CPU per message; %d commits in other databases meanwhile", tag, a.CPUMicrosPerMsg, a.OtherDBCommits)
	}
	return a
}

// relationWAL is the WAL of one relation (or of no relation) per message.
type relationWAL struct {
	Relation string  `json:"relation"`
	Bytes    float64 `json:"bytes"`
	Records  float64 `json:"records"`
	// FullPageBytes is the part of Bytes that is full-page images: the
	// first change of each page after a checkpoint.
	FullPageBytes float64 `json:"full_page_bytes"`
}

// walTotal is the WAL of one relation over a window.
type walTotal struct {
	relation            string
	records, bytes, fpi int64
}

// otherRecords names the records that touch none of the bench database's
// relations: its transactions' commits, mostly.
const otherRecords = "commits and other"

func perMessage(rels []walTotal, msgs int) []relationWAL {
	n := float64(msgs)
	out := make([]relationWAL, len(rels))
	for i, r := range rels {
		out[i] = relationWAL{Relation: r.relation, Bytes: float64(r.bytes) / n, Records: float64(r.records) / n, FullPageBytes: float64(r.fpi) / n}
	}
	return out
}

// walSplit formats a split for the log: every relation of 1 byte a message
// or more, largest first.
func walSplit(rels []relationWAL) string {
	var parts []string
	for _, r := range rels {
		if r.Bytes >= 1 {
			parts = append(parts, fmt.Sprintf("%s %.0f", r.Relation, r.Bytes))
		}
	}
	return strings.Join(parts, ", ")
}

// databaseWAL counts the WAL records, and their bytes, written between two
// samples for the bench database alone: those that touch one of its
// relations, and every other record of the transactions that wrote those
// (their commits). pg_stat_wal counts the whole server's, other databases'
// work included. It needs the pg_walinspect extension (created by the
// bench when the server has it) and the WAL still on disk.
func (b *bench) databaseWAL(ctx context.Context, from, to pgSample) ([]walTotal, error) {
	if !b.walInspect {
		return nil, errors.New("pg_walinspect is not available")
	}
	if !from.ok || !to.ok || from.lsn == "" || to.lsn == "" {
		return nil, errors.New("no WAL positions")
	}
	// A record's first block names its relation by file node (named with
	// its schema outside public: the history's outbox is another table of
	// the same name); the
	// scenario's relations still have theirs (they are emptied before the
	// next scenario, which gives them new ones).
	pattern := fmt.Sprintf("%%/%d/%%", to.dbOID)
	rows, _ := b.pool.Query(ctx, `WITH r AS (
			SELECT xid::text AS xid, record_length, fpi_length, block_ref FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
		), mine AS (
			SELECT DISTINCT xid FROM r WHERE block_ref LIKE $3 AND xid <> '0'
		), kept AS (
			SELECT record_length, fpi_length,
			       CASE WHEN block_ref LIKE $3 THEN (regexp_match(block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid END AS node
			FROM r
			WHERE block_ref LIKE $3 OR (xid <> '0' AND xid IN (SELECT xid FROM mine))
		)
		SELECT coalesce(CASE WHEN n.nspname = 'public' THEN c.relname ELSE n.nspname || '.' || c.relname END,
		                CASE WHEN k.node IS NULL THEN $4 ELSE 'file node ' || k.node END),
		       count(*), coalesce(sum(k.record_length), 0)::bigint, coalesce(sum(k.fpi_length), 0)::bigint
		FROM kept k LEFT JOIN pg_class c ON c.relfilenode = k.node AND c.relfilenode <> 0
		LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
		GROUP BY 1 ORDER BY 3 DESC`, from.lsn, to.lsn, pattern, otherRecords)
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (walTotal, error) {
		var t walTotal
		err := r.Scan(&t.relation, &t.records, &t.bytes, &t.fpi)
		return t, err
	})
}

// holdWAL makes a temporary replication slot, on a connection of its
// own, that keeps the WAL written from now on until releaseWAL; a slot
// still held (by a scenario that failed) is released first. Without it the
// WAL figures may fall back to the whole server's.
func (b *bench) holdWAL(ctx context.Context) {
	b.releaseWAL()
	if !b.walInspect {
		return
	}
	conn, err := pgx.Connect(ctx, b.cfg.databaseURL)
	if err != nil {
		b.logf("no replication slot to keep the WAL until it is counted: %v", err)
		return
	}
	slot := "sendonce_bench_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true, true)`, slot); err != nil {
		b.logf("no replication slot to keep the WAL until it is counted: %v", err)
		_ = conn.Close(ctx)
		return
	}
	b.walHold = conn
}

// releaseWAL drops the slot with its connection.
func (b *bench) releaseWAL() {
	if b.walHold != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.walHold.Close(ctx)
		b.walHold = nil
	}
}
