package sender

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/backoff"
	"github.com/sendonce/sendonce/internal/outbox"
)

// writeLoop commits status writes in batches and only then answers
// JetStream, until results is closed and drained. A batch whose write fails
// is kept and written again, however long the database is away, while its
// messages stay held; it returns how many results it gave up on because
// hold ended first.
func (s *Sender) writeLoop(hold context.Context, results <-chan result) (unwritten int) {
	batch := make([]result, 0, s.cfg.WriteBatch)
	for {
		r, ok := <-results
		if !ok {
			return unwritten
		}
		batch = append(batch[:0], r)
		var linger *time.Timer
	more:
		for len(batch) < s.cfg.WriteBatch {
			select {
			case r, ok := <-results:
				if !ok {
					break more
				}
				batch = append(batch, r)
				continue
			default:
			}
			// Attempts still running will bring their outcomes within
			// a provider call: a busy sender waits up to WriteLinger for
			// them, to commit them together.
			if s.cfg.WriteLinger <= 0 || s.calling.Load() == 0 {
				break more
			}
			if linger == nil {
				linger = time.NewTimer(s.cfg.WriteLinger)
			}
			select {
			case r, ok := <-results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			case <-linger.C:
				break more
			}
		}
		if linger != nil {
			linger.Stop()
		}
		writeStart := time.Now()
		written, ok := s.writeStatuses(hold, batch)
		if s.cfg.Tracing != nil {
			s.traceWrites(batch, written, ok, writeStart, time.Now())
		}
		if !ok {
			// The shutdown timeout passed with the database still away: the
			// messages go unanswered and come back at their ack deadline.
			for _, r := range batch {
				r.keep()
			}
			unwritten += len(batch)
			continue
		}
		now := time.Now()
		for _, r := range batch {
			w, applied := written[r.row.ID]
			// A row the provider took needs no fence: whoever wrote it
			// first, the message is answered.
			if r.row.Status != "" && !accepted(r.row.Status) && !applied {
				// Another claim owns the row now (this one's lease ran out,
				// or an operator replayed it): its delivery decides; this
				// one stays silent.
				s.metrics.overtaken.Inc()
				r.keep()
				continue
			}
			if r.letter != nil && applied {
				l := *r.letter
				l.Gen, l.Attempts = w.Gen, w.Attempts
				if w.Reason != "" {
					l.Reason = w.Reason // the row's, should the database have made dead unknown
				}
				if !s.letters.push(l) {
					s.metrics.lettersDeferred.Inc()
				}
			}
			switch r.action {
			case ack:
				r.answer(func(m jetstream.Msg) { _ = m.Ack() })
				if r.row.Status == outbox.StatusSent {
					s.metrics.commitToSent.Observe(now.Sub(r.createdAt).Seconds())
				}
			case nak:
				r.answer(func(m jetstream.Msg) { _ = m.NakWithDelay(r.delay) })
			case term:
				r.answer(func(m jetstream.Msg) { _ = m.Term() })
			default:
				r.keep()
			}
		}
	}
}

// writeStatuses commits the batch's status writes and attempts-log records
// and returns the rows whose write applied. A failed write is tried again
// until it commits or hold ends (false). A retry after an error whose commit
// in fact went through applies again to the rows it already moved (the
// writes are fenced on the claim, not on the status they left), and does not
// log the attempts twice.
func (s *Sender) writeStatuses(hold context.Context, batch []result) (map[uuid.UUID]outbox.Written, bool) {
	rows := make([]outbox.Result, 0, len(batch))
	attempts := make([]outbox.Attempt, 0, len(batch))
	for _, r := range batch {
		if r.row.Status != "" {
			rows = append(rows, r.row)
		}
		attempts = append(attempts, r.attempts...)
	}
	if len(rows) == 0 && len(attempts) == 0 {
		return nil, true
	}
	s.metrics.writeRows.Observe(float64(len(rows)))
	for failures := 0; ; {
		var written map[uuid.UUID]outbox.Written
		ctx, cancel := context.WithTimeout(hold, s.cfg.DBTimeout)
		err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
			var err error
			written, err = outbox.ApplyResults(ctx, tx, rows, attempts, failures > 0)
			return err
		})
		cancel()
		if err == nil {
			if failures > 0 {
				s.log.Info("status write committed after failures; the messages were held meanwhile", "failures", failures, "rows", len(rows))
			}
			return written, true
		}
		failures++
		s.metrics.dbRetries.WithLabelValues("status_write").Inc()
		d := min(2*time.Second, 50*time.Millisecond<<min(failures, 6))
		if retrying(failures) {
			s.log.Warn("status write failed; keeping the outcomes and trying again", "err", err, "rows", len(rows), "failures", failures, "retry_in", d.String())
		}
		if !backoff.Sleep(hold, backoff.Jitter(d)) {
			s.log.Error("status write still failing at the shutdown timeout; the messages will be redelivered", "err", err, "rows", len(rows))
			return nil, false
		}
	}
}

// accepted reports whether status says the provider took the message.
func accepted(status outbox.State) bool {
	return status == outbox.StatusSent || status == outbox.StatusDelivered || status == outbox.StatusUndelivered
}
