package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/outbox"
)

// txRows is how many rows one writer transaction enqueues.
const txRows = 50

// loader enqueues the rows the way an application would, from a few
// writers in transactions of txRows, paced so that they are spread over the
// load phase. It remembers the id of every committed row by row index.
type loader struct {
	pool     *pgxpool.Pool
	rows     int
	writers  int
	duration time.Duration
	logf     func(string, ...any)
	// numbers, when set, is the pool of numbers the rows go to, row i to
	// number i mod numbers (-provider twilio); 0: a number of its own each.
	numbers int

	next  atomic.Int64 // first row index of the next chunk to write
	count atomic.Int64 // committed rows
	mu    sync.Mutex
	ids   []uuid.UUID // by row index; uuid.Nil until committed
	done  chan struct{}
}

func newLoader(pool *pgxpool.Pool, rows, writers int, d time.Duration, logf func(string, ...any)) *loader {
	return &loader{pool: pool, rows: rows, writers: writers, duration: d, logf: logf,
		ids: make([]uuid.UUID, rows), done: make(chan struct{})}
}

func (l *loader) committed() int { return int(l.count.Load()) }

// committedIDs returns the ids of the committed rows.
func (l *loader) committedIDs() []uuid.UUID {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]uuid.UUID, 0, l.committed())
	for _, id := range l.ids {
		if id != uuid.Nil {
			out = append(out, id)
		}
	}
	return out
}

// run writes every row and returns when all are committed, a writer failed
// for good, or ctx is done. It closes l.done when it returns.
func (l *loader) run(ctx context.Context) error {
	defer close(l.done)
	start := time.Now()
	errs := make(chan error, l.writers)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range l.writers {
		wg.Go(func() {
			if err := l.writer(wctx, start); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	return ctx.Err()
}

func (l *loader) writer(ctx context.Context, start time.Time) error {
	for {
		first := int(l.next.Add(txRows)) - txRows
		if first >= l.rows {
			return nil
		}
		last := min(first+txRows, l.rows)
		// The chunk is due when its share of the load phase has passed.
		due := start.Add(time.Duration(float64(l.duration) * float64(first) / float64(l.rows)))
		if err := sleepCtx(ctx, time.Until(due)); err != nil {
			return nil // cancelled; run reports it
		}
		if err := l.writeChunk(ctx, first, last); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// writeChunk enqueues rows [first, last) in one transaction, retrying a
// failed transaction a few times. A commit whose outcome is unknown is
// looked up before it is retried, so that no row is written twice.
func (l *loader) writeChunk(ctx context.Context, first, last int) error {
	const tries = 10
	var lastErr error
	for try := 1; try <= tries; try++ {
		ids := make([]uuid.UUID, 0, last-first)
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := pgx.BeginFunc(tctx, l.pool, func(tx pgx.Tx) error {
			for i := first; i < last; i++ {
				id, err := outbox.Enqueue(tctx, tx, l.phone(i), body(i))
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		if err != nil && len(ids) == last-first {
			// The commit may have happened: look.
			var n int
			if qerr := l.pool.QueryRow(tctx, `SELECT count(*) FROM sms_outbox WHERE id = ANY($1)`, ids).Scan(&n); qerr == nil && n == len(ids) {
				err = nil
			}
		}
		cancel()
		if err == nil {
			l.mu.Lock()
			copy(l.ids[first:last], ids)
			l.mu.Unlock()
			l.count.Add(int64(len(ids)))
			return nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.logf("writer: rows %d-%d: %v (try %d of %d)", first, last-1, err, try, tries)
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("rows %d-%d: %w", first, last-1, lastErr)
}

// phone is row i's number: its own, or one of the pool.
func (l *loader) phone(i int) string {
	if l.numbers > 0 {
		i %= l.numbers
	}
	return phone(i)
}

// phone is the number of index i.
func phone(i int) string { return fmt.Sprintf("+1555%07d", i) }

// body is row i's text, unique per row: two rows with the same text to
// the same number (twins) are tested elsewhere.
func body(i int) string { return fmt.Sprintf("soak message %d", i) }
