package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// State is the status of a message: the sms_outbox table's status column.
type State string

// The statuses a message goes through, in order. See the package
// documentation for how one leads to the next.
const (
	// StatusPending is a message written by an application and not yet
	// handed to the broker.
	StatusPending State = "pending"
	// StatusQueued is a message in the broker, waiting for a sender or for
	// its next attempt.
	StatusQueued State = "queued"
	// StatusSending is a message a sender is calling the provider for.
	StatusSending State = "sending"
	// StatusSent is a message the provider accepted.
	StatusSent State = "sent"
	// StatusDelivered is a message the provider reported delivered to the
	// phone, by a delivery receipt (final).
	StatusDelivered State = "delivered"
	// StatusUndelivered is a message the provider reported it could not
	// deliver, by a delivery receipt (final).
	StatusUndelivered State = "undelivered"
	// StatusDead is a message that will not be sent: the provider refused
	// it, or its attempts ran out while no attempt may have reached the
	// provider. The user got nothing (final, unless a signed receipt from
	// the provider says it had the message: the status then follows it).
	StatusDead State = "dead"
	// StatusUnknown is a message an attempt may or may not have delivered
	// (a lost response at a provider without idempotency). It is never
	// retried blindly; a receipt, a lookup or a person settles it.
	StatusUnknown State = "unknown"
)

// Terminal reports whether the pipeline is done with a message in state s:
// no sender will call the provider for it again. A sent or unknown message
// may still be settled by a delivery receipt, and so may a dead one the
// provider reports having after all.
func (s State) Terminal() bool {
	switch s {
	case StatusSent, StatusDelivered, StatusUndelivered, StatusDead, StatusUnknown:
		return true
	}
	return false
}

// MaxBodyChars is the longest body accepted, in characters (not bytes).
const MaxBodyChars = 1600

var e164RE = regexp.MustCompile(`^\+[1-9][0-9]{1,14}$`)

// ErrInvalid is matched by errors.Is for every *ValidationError.
var ErrInvalid = errors.New("outbox: invalid message")

// ErrNotFound is returned by Status and StatusSQL for an id that has no
// row: it was never committed, or it finished long enough ago to be purged.
var ErrNotFound = errors.New("outbox: no such message")

// ValidationError names the field of a message that was refused. Its text
// never contains the field's value: phone numbers and bodies stay out of
// logs.
type ValidationError struct {
	// Field is "to" or "body".
	Field string
	// Reason says what is wrong, without the value.
	Reason string
}

// Error returns "outbox: invalid <field>: <reason>".
func (e *ValidationError) Error() string { return "outbox: invalid " + e.Field + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// Validate checks a message the way the table's constraints will: to is an
// E.164 number ("+", then 2 to 15 digits, the first not 0), body is 1 to
// MaxBodyChars characters of valid UTF-8 without NUL. It returns nil or a
// *ValidationError.
func Validate(to, body string) error {
	if !e164RE.MatchString(to) {
		return &ValidationError{Field: "to", Reason: "not an E.164 number (+ then 2 to 15 digits, no leading 0)"}
	}
	if !utf8.ValidString(body) {
		return &ValidationError{Field: "body", Reason: "not valid UTF-8"}
	}
	switch n := utf8.RuneCountInString(body); {
	case n == 0:
		return &ValidationError{Field: "body", Reason: "empty"}
	case n > MaxBodyChars:
		return &ValidationError{Field: "body", Reason: fmt.Sprintf("%d characters, more than %d", n, MaxBodyChars)}
	}
	for i := 0; i < len(body); i++ {
		if body[i] == 0 {
			return &ValidationError{Field: "body", Reason: "contains a NUL character"}
		}
	}
	return nil
}

// Priority orders messages waiting to be sent: every urgent message before
// any normal one, normal before bulk, while each lower lane still gets a
// configured minimum share of the senders (so a continuous stream of urgent
// messages delays bulk ones, never starves them). A message's priority is
// part of its intent: it never changes after the insert.
type Priority int16

// The priorities; the zero value of a Message's Priority means Normal.
const (
	// Urgent is for messages a user is waiting for: one-time codes, alerts.
	Urgent Priority = 1
	// Normal is the default.
	Normal Priority = 2
	// Bulk is for campaigns and digests, sent when nothing more urgent waits.
	Bulk Priority = 3
)

// Valid reports whether p is Urgent, Normal or Bulk.
func (p Priority) Valid() bool { return p >= Urgent && p <= Bulk }

// Option changes how one message is enqueued.
type Option func(*options)

type options struct{ priority Priority }

// WithPriority enqueues the message with priority p (default Normal). An
// invalid priority is refused with a *ValidationError on "priority".
func WithPriority(p Priority) Option { return func(o *options) { o.priority = p } }

func apply(opts []Option) (options, error) {
	o := options{priority: Normal}
	for _, opt := range opts {
		opt(&o)
	}
	if !o.priority.Valid() {
		return o, &ValidationError{Field: "priority", Reason: "not 1 (urgent), 2 (normal) or 3 (bulk)"}
	}
	return o, nil
}

// Message is one message of EnqueueBatch.
type Message struct {
	// To is the E.164 number to send to.
	To string
	// Body is the text.
	Body string
	// Priority is the message's priority; zero means Normal.
	Priority Priority
}

// insert returns the statement and arguments that write one message. A
// normal message names no priority column, so that an application works
// against a database migrated before priorities as well.
func insert(id uuid.UUID, to, body string, o options) (string, []any) {
	if o.priority == Normal {
		return `INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, $3)`, []any{id, to, body}
	}
	return `INSERT INTO sms_outbox (id, to_e164, body, priority) VALUES ($1, $2, $3, $4)`, []any{id, to, body, int16(o.priority)}
}

// Enqueue records the intent to send body to the E.164 number to, inside
// the application's transaction tx, and returns the message's id: its
// idempotency key for its whole life. The message is sent only if tx
// commits. Invalid input returns a *ValidationError before any SQL.
func Enqueue(ctx context.Context, tx pgx.Tx, to, body string, opts ...Option) (uuid.UUID, error) {
	o, err := apply(opts)
	if err != nil {
		return uuid.Nil, err
	}
	id, err := newID(to, body)
	if err != nil {
		return uuid.Nil, err
	}
	sql, args := insert(id, to, body, o)
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return uuid.Nil, fmt.Errorf("outbox: insert: %w", err)
	}
	return id, nil
}

// EnqueueSQL is Enqueue for database/sql: it writes the message inside tx,
// a transaction of any Postgres driver.
func EnqueueSQL(ctx context.Context, tx *sql.Tx, to, body string, opts ...Option) (uuid.UUID, error) {
	o, err := apply(opts)
	if err != nil {
		return uuid.Nil, err
	}
	id, err := newID(to, body)
	if err != nil {
		return uuid.Nil, err
	}
	query, args := insert(id, to, body, o)
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		return uuid.Nil, fmt.Errorf("outbox: insert: %w", err)
	}
	return id, nil
}

// EnqueueBatch records many messages inside tx in one statement (one round
// trip, and one wake-up of the relays) and returns their ids in the order
// of msgs. Every message is validated first: if one is invalid, nothing is
// written and the error, a *ValidationError wrapped with the message's
// index, says which.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, msgs []Message) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	ids := make([]uuid.UUID, len(msgs))
	// [16]byte rather than uuid.UUID: pgx encodes it as a uuid without
	// going through a text form.
	raw := make([][16]byte, len(msgs))
	tos := make([]string, len(msgs))
	bodies := make([]string, len(msgs))
	prios := make([]int16, len(msgs))
	allNormal := true
	for i, m := range msgs {
		p := m.Priority
		if p == 0 {
			p = Normal
		}
		if !p.Valid() {
			return nil, fmt.Errorf("message %d of the batch: %w", i, &ValidationError{Field: "priority", Reason: "not 1 (urgent), 2 (normal) or 3 (bulk)"})
		}
		id, err := newID(m.To, m.Body)
		if err != nil {
			return nil, fmt.Errorf("message %d of the batch: %w", i, err)
		}
		ids[i], raw[i], tos[i], bodies[i], prios[i] = id, id, m.To, m.Body, int16(p)
		allNormal = allNormal && p == Normal
	}
	var err error
	if allNormal {
		_, err = tx.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[])`, raw, tos, bodies)
	} else {
		_, err = tx.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, priority)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[])`, raw, tos, bodies, prios)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: insert batch of %d: %w", len(msgs), err)
	}
	return ids, nil
}

// newID validates a message and mints its id.
func newID(to, body string) (uuid.UUID, error) {
	if err := Validate(to, body); err != nil {
		return uuid.Nil, err
	}
	id, err := uuid.NewRandom()
	if err != nil {
		return uuid.Nil, fmt.Errorf("outbox: mint id: %w", err)
	}
	return id, nil
}

// MessageStatus is what an application may read back about a message.
type MessageStatus struct {
	// ID is the message's id.
	ID uuid.UUID
	// Status is its current state.
	Status State
	// Attempts is the number of provider attempts started so far.
	Attempts int
	// ProviderRef is the provider's id for the message, once it was
	// accepted; empty before.
	ProviderRef string
	// LastError is the latest failure, with digit runs (phone numbers)
	// scrubbed; empty when none.
	LastError string
	// CreatedAt is when the message was written; UpdatedAt when its row
	// last changed.
	CreatedAt, UpdatedAt time.Time
}

// Querier is what Status reads through: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQLQuerier is what StatusSQL reads through: a *sql.DB, a *sql.Conn or a
// *sql.Tx.
type SQLQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// statusSQL reads one row's status through the function sendonce_status
// (migration 0010): the application's role holds no SELECT on sms_outbox,
// so it reads the rows whose ids it was given and no other. legacySQL is
// the read of a schema older than that function.
const (
	statusSQL = `SELECT id, status, attempt_count, provider_ref, last_error, created_at, updated_at
	FROM sendonce_status($1)`
	legacySQL = `SELECT id, status, attempt_count, provider_ref, last_error, created_at, updated_at
	FROM sms_outbox WHERE id = $1`
)

// Status returns the status of the message id, or ErrNotFound.
//
// On a database not yet migrated to sendonce_status it reads the table, as
// the releases before did, so that applications can be upgraded before the
// schema; inside a transaction that fallback is not possible (the failed
// call has aborted it) and the error is returned.
func Status(ctx context.Context, db Querier, id uuid.UUID) (MessageStatus, error) {
	st, err := scanStatus(db.QueryRow(ctx, statusSQL, id).Scan)
	if _, inTx := db.(pgx.Tx); undefinedFunction(err) && !inTx {
		st, err = scanStatus(db.QueryRow(ctx, legacySQL, id).Scan)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return MessageStatus{}, ErrNotFound
	}
	return st, err
}

// StatusSQL is Status for database/sql.
func StatusSQL(ctx context.Context, db SQLQuerier, id uuid.UUID) (MessageStatus, error) {
	st, err := scanStatus(db.QueryRowContext(ctx, statusSQL, id).Scan)
	if _, inTx := db.(*sql.Tx); undefinedFunction(err) && !inTx {
		st, err = scanStatus(db.QueryRowContext(ctx, legacySQL, id).Scan)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return MessageStatus{}, ErrNotFound
	}
	return st, err
}

// undefinedFunction reports whether err is Postgres's undefined_function
// (42883), from any driver that reports the SQLSTATE.
func undefinedFunction(err error) bool {
	var st interface{ SQLState() string }
	return err != nil && errors.As(err, &st) && st.SQLState() == "42883"
}

// scanStatus scans a row of statusSQL; a missing row's error is returned
// unwrapped, for the caller to recognise.
func scanStatus(scan func(dest ...any) error) (MessageStatus, error) {
	var r MessageStatus
	var status string
	var ref, lastErr *string
	err := scan(&r.ID, &status, &r.Attempts, &ref, &lastErr, &r.CreatedAt, &r.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return MessageStatus{}, err
	}
	if err != nil {
		return MessageStatus{}, fmt.Errorf("outbox: read status: %w", err)
	}
	r.Status = State(status)
	if ref != nil {
		r.ProviderRef = *ref
	}
	if lastErr != nil {
		r.LastError = *lastErr
	}
	return r, nil
}
