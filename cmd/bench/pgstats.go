package main

import (
	"context"
	"time"
)

// pgSample is the bench database's activity counters (pg_stat_database)
// and the server's WAL counters (pg_stat_wal, shared with every other
// database on the server).
type pgSample struct {
	at                                     time.Time
	commits, rollbacks, inserted, updated  int64
	walRecords, walFPI, walBytes, walSyncs int64
	ok                                     bool
}

// samplePG reads the counters. Backends publish theirs at most once a
// second and when they exit, so the end sample is taken after the relay and
// senders have stopped.
func (b *bench) samplePG(ctx context.Context) pgSample {
	s := pgSample{at: time.Now()}
	if _, err := b.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return s
	}
	err := b.pool.QueryRow(ctx, `SELECT d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated,
			w.wal_records, w.wal_fpi, w.wal_bytes::bigint, w.wal_sync
		FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()`).
		Scan(&s.commits, &s.rollbacks, &s.inserted, &s.updated, &s.walRecords, &s.walFPI, &s.walBytes, &s.walSyncs)
	s.ok = err == nil
	return s
}

// pgActivity is what Postgres did over a scenario, per message.
type pgActivity struct {
	// Commits is how many transactions committed in the bench database,
	// CommitsPerMsg the same per message.
	Commits       int64   `json:"commits"`
	CommitsPerMsg float64 `json:"commits_per_msg"`
	// RowsUpdated and RowsInserted count row writes (outbox and attempts).
	RowsUpdated  int64 `json:"rows_updated"`
	RowsInserted int64 `json:"rows_inserted"`
	// WALBytesPerMsg and WALRecordsPerMsg are the WAL written per message.
	WALBytesPerMsg   float64 `json:"wal_bytes_per_msg"`
	WALRecordsPerMsg float64 `json:"wal_records_per_msg"`
	// WALSyncs counts WAL flushes to disk (one per commit not grouped with
	// another), WALFullPages the full-page images written.
	WALSyncs     int64 `json:"wal_syncs"`
	WALFullPages int64 `json:"wal_full_page_images"`
	// Note says where the counters come from.
	Note string `json:"note"`
}

func (s pgSample) since(start pgSample, msgs int) *pgActivity {
	if !s.ok || !start.ok || msgs <= 0 {
		return nil
	}
	n := float64(msgs)
	return &pgActivity{
		Commits: s.commits - start.commits, CommitsPerMsg: float64(s.commits-start.commits) / n,
		RowsUpdated: s.updated - start.updated, RowsInserted: s.inserted - start.inserted,
		WALBytesPerMsg: float64(s.walBytes-start.walBytes) / n, WALRecordsPerMsg: float64(s.walRecords-start.walRecords) / n,
		WALSyncs: s.walSyncs - start.walSyncs, WALFullPages: s.walFPI - start.walFPI,
		Note: "commits and rows: the bench database (the bench's own polling included); WAL: the whole server",
	}
}

// endPG stops the scenario's processes (their backends publish their
// counters as they exit) and returns Postgres's activity since pg0.
func (b *bench) endPG(ctx context.Context, tag string, pg0 pgSample, msgs int) *pgActivity {
	b.stopAll()
	time.Sleep(300 * time.Millisecond) // the backends exit just after their clients
	a := b.samplePG(ctx).since(pg0, msgs)
	if a != nil {
		b.logf("[%s] postgres: %.2f commits, %.2f row updates, %.1f WAL records, %.0f WAL bytes per message; %d WAL syncs",
			tag, a.CommitsPerMsg, float64(a.RowsUpdated)/float64(msgs), a.WALRecordsPerMsg, a.WALBytesPerMsg, a.WALSyncs)
	}
	return a
}
