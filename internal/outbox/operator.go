package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ReplayResult says what Replay did with one id.
type ReplayResult struct {
	// ID is the row id.
	ID uuid.UUID
	// Status is the row's status before the replay ("" when there is no row).
	Status State
	// Replayed is true when the row went back to pending.
	Replayed bool
	// Gen is the new publish generation (when replayed).
	Gen int32
}

// Replay puts the dead or unknown rows ids back to pending with the same id
// (the same idempotency key), a new publish generation (so JetStream does not
// deduplicate the republication) and a fresh attempt budget; the attempts log
// keeps the history. Sent rows are refused, and so are rows still in flight.
// With dryRun it reports what it would do and changes nothing.
func Replay(ctx context.Context, tx pgx.Tx, ids []uuid.UUID, dryRun bool) ([]ReplayResult, error) {
	rows, _ := tx.Query(ctx, `SELECT id, status, publish_gen FROM sms_outbox
		WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids)
	type cur struct {
		id     uuid.UUID
		status *string
		gen    *int32
	}
	locked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cur, error) {
		var c cur
		err := r.Scan(&c.id, &c.status, &c.gen)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: replay: %w", err)
	}
	byID := make(map[uuid.UUID]cur, len(locked))
	for _, c := range locked {
		byID[c.id] = c
	}
	found := make([]cur, 0, len(ids))
	for _, id := range ids {
		c, ok := byID[id]
		if !ok {
			c = cur{id: id}
		}
		found = append(found, c)
	}
	out := make([]ReplayResult, 0, len(found))
	for _, c := range found {
		r := ReplayResult{ID: c.id}
		if c.status != nil {
			r.Status = State(*c.status)
		}
		if r.Status == StatusDead || r.Status == StatusUnknown {
			r.Replayed, r.Gen = true, *c.gen+1
			if !dryRun {
				_, err := tx.Exec(ctx, `UPDATE sms_outbox
					SET status = 'pending', publish_gen = publish_gen + 1, attempt_count = 0,
					    next_attempt_at = now(), updated_at = now(), stream_seq = NULL,
					    last_error = 'replayed by operator; before: ' || coalesce(last_error, '')
					WHERE id = $1 AND status IN ('dead', 'unknown')`, c.id)
				if err != nil {
					return nil, fmt.Errorf("outbox: replay %s: %w", c.id, err)
				}
			}
		}
		out = append(out, r)
	}
	if !dryRun {
		// Wake the relays now rather than at their next poll.
		if _, err := tx.Exec(ctx, `SELECT pg_notify('sms_outbox', '')`); err != nil {
			return nil, fmt.Errorf("outbox: replay: notify: %w", err)
		}
	}
	return out, nil
}

// Row is everything the operator's trace shows of an outbox row; the phone
// number is masked and the body reduced to its length.
type Row struct {
	ID                     uuid.UUID
	Status                 State
	ToMasked               string
	BodyChars              int
	Attempts, MaxAttempts  int
	Gen                    int32
	StreamSeq              *int64
	ProviderRef, LastError string
	CreatedAt, UpdatedAt   time.Time
	NextAttemptAt          time.Time
	// MaybeAccepted is set once an attempt may have reached the provider.
	MaybeAccepted bool
}

// GetRow reads one row for a trace.
func GetRow(ctx context.Context, q Querier, id uuid.UUID) (Row, error) {
	var r Row
	var to string
	var ref, lastErr *string
	err := q.QueryRow(ctx, `SELECT id, status, to_e164, char_length(body), attempt_count, max_attempts,
			publish_gen, stream_seq, provider_ref, last_error, created_at, updated_at, next_attempt_at, maybe_accepted
		FROM sms_outbox WHERE id = $1`, id).
		Scan(&r.ID, &r.Status, &to, &r.BodyChars, &r.Attempts, &r.MaxAttempts, &r.Gen, &r.StreamSeq,
			&ref, &lastErr, &r.CreatedAt, &r.UpdatedAt, &r.NextAttemptAt, &r.MaybeAccepted)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		// A role without access to the number and the body (the relay's)
		// still sees everything else.
		err = q.QueryRow(ctx, `SELECT id, status, attempt_count, max_attempts,
				publish_gen, stream_seq, provider_ref, last_error, created_at, updated_at, next_attempt_at, maybe_accepted
			FROM sms_outbox WHERE id = $1`, id).
			Scan(&r.ID, &r.Status, &r.Attempts, &r.MaxAttempts, &r.Gen, &r.StreamSeq,
				&ref, &lastErr, &r.CreatedAt, &r.UpdatedAt, &r.NextAttemptAt, &r.MaybeAccepted)
		to, r.BodyChars = "", -1
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, ErrNotFound
	}
	if err != nil {
		return Row{}, fmt.Errorf("outbox: read row: %w", err)
	}
	r.ToMasked = "(not visible to this role)"
	if to != "" {
		r.ToMasked = MaskPhone(to)
	}
	if ref != nil {
		r.ProviderRef = *ref
	}
	if lastErr != nil {
		r.LastError = *lastErr
	}
	return r, nil
}

// Attempts returns the attempts log of one row, oldest first.
func Attempts(ctx context.Context, q Querier, id uuid.UUID) ([]Attempt, error) {
	rows, _ := q.Query(ctx, `SELECT outbox_id, attempt, started_at, coalesce(latency_ms, 0), outcome,
			coalesce(http_status, 0), coalesce(provider_code, 0), coalesce(error, ''), coalesce(sender, '')
		FROM sms_attempts WHERE outbox_id = $1 ORDER BY id`, id)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		var ms float64
		err := r.Scan(&a.OutboxID, &a.Number, &a.StartedAt, &ms, &a.Outcome, &a.HTTPStatus, &a.ProviderCode, &a.Error, &a.Sender)
		a.Latency = time.Duration(ms * float64(time.Millisecond))
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read attempts: %w", err)
	}
	return out, nil
}

// MaskPhone keeps an E.164 number's leading "+" and first digit (the start
// of the country code) and its last two digits: "+15551234567" becomes
// "+1*******67".
func MaskPhone(e164 string) string {
	if len(e164) < 5 {
		return "+***"
	}
	b := []byte(e164)
	for i := 2; i < len(b)-2; i++ {
		b[i] = '*'
	}
	return string(b)
}
