package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"
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
	// StatusScheduled is a message written with a send time in the future
	// (WithSendAt): it waits, and becomes pending at that time.
	StatusScheduled State = "scheduled"
	// StatusExpired is a message that reached its expiry (WithExpiresAt)
	// before any provider call could have taken it: it was never sent
	// (final).
	StatusExpired State = "expired"
	// StatusCancelled is a message the application cancelled (Cancel)
	// before any provider call started: it was never sent (final).
	StatusCancelled State = "cancelled"
	// StatusSuppressed is a message to a number on the suppression list
	// (its owner replied STOP, or an operator or the application added
	// it): it was never sent (final).
	StatusSuppressed State = "suppressed"
)

// Terminal reports whether the pipeline is done with a message in state s:
// no sender will call the provider for it again. A sent or unknown message
// may still be settled by a delivery receipt, and so may a dead one the
// provider reports having after all.
func (s State) Terminal() bool {
	switch s {
	case StatusSent, StatusDelivered, StatusUndelivered, StatusDead, StatusUnknown,
		StatusExpired, StatusCancelled, StatusSuppressed:
		return true
	}
	return false
}

// Unsent reports whether a message in state s is finished without having
// been sent: dead, expired, cancelled or suppressed. The user got nothing
// (a dead message a signed receipt later shows the provider had is the one
// exception: it then follows the receipt).
func (s State) Unsent() bool {
	switch s {
	case StatusDead, StatusExpired, StatusCancelled, StatusSuppressed:
		return true
	}
	return false
}

// MaxBodyChars is the longest body accepted, in characters (not bytes).
const MaxBodyChars = 1600

var e164RE = regexp.MustCompile(`^\+[1-9][0-9]{1,14}$`)

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

type options struct {
	priority          Priority
	key               string
	keyed             bool
	sendAt, expiresAt time.Time
	created           *bool
	createdEach       *[]bool
	// traceparent is the caller's span (W3C Trace Context), from the
	// context; "" when it has none.
	traceparent string
}

// WithPriority enqueues the message with priority p (default Normal). An
// invalid priority is refused with a *ValidationError on "priority".
func WithPriority(p Priority) Option { return func(o *options) { o.priority = p } }

// WithKey names the message's intent with the application's own key (an
// order id and what the message is for, a form's submission id): at most
// one message is ever written for one key. Enqueueing the same key again
// with the same number and body writes nothing and returns the first
// message's id (Created says which happened); with another number or body
// it fails with an error matching ErrKeyReused and writes nothing. The key
// is 1 to MaxKeyChars characters without control characters; it lives as
// long as its message's row (retention purges finished rows, and with
// them their keys).
func WithKey(key string) Option { return func(o *options) { o.key, o.keyed = key, true } }

// Created sets *p, once Enqueue or EnqueueSQL succeeds, to whether this
// call wrote the message: false when WithKey's key already named one.
func Created(p *bool) Option { return func(o *options) { o.created = p } }

// WithSendAt schedules the message: no provider call is made before t.
// Until then its status is StatusScheduled, and Cancel takes it back. A
// time in the past (or zero) sends at once.
func WithSendAt(t time.Time) Option { return func(o *options) { o.sendAt = t } }

// WithExpiresAt gives the message an expiry: no provider call is started
// at or after t, and a message that reaches it unsent ends
// StatusExpired. The provider is told the time left, so that it does not
// deliver the message later either (where its API allows). A message a
// call may already have reached is not expired: the provider's answer, a
// lookup or a receipt settles it. t must be after WithSendAt's time.
func WithExpiresAt(t time.Time) Option { return func(o *options) { o.expiresAt = t } }

// MaxKeyChars is the longest idempotency key accepted, in characters.
const MaxKeyChars = 255

func apply(opts []Option) (options, error) {
	o := options{priority: Normal}
	for _, opt := range opts {
		opt(&o)
	}
	if !o.priority.Valid() {
		return o, &ValidationError{Field: "priority", Reason: "not 1 (urgent), 2 (normal) or 3 (bulk)"}
	}
	if err := validateIntent(o.key, o.keyed, o.sendAt, o.expiresAt); err != nil {
		return o, err
	}
	return o, nil
}

// validateIntent checks a message's key and times as the table will.
func validateIntent(key string, keyed bool, sendAt, expiresAt time.Time) error {
	if keyed {
		switch n := utf8.RuneCountInString(key); {
		case n == 0:
			return &ValidationError{Field: "key", Reason: "empty"}
		case !utf8.ValidString(key):
			return &ValidationError{Field: "key", Reason: "not valid UTF-8"}
		case n > MaxKeyChars:
			return &ValidationError{Field: "key", Reason: fmt.Sprintf("%d characters, more than %d", n, MaxKeyChars)}
		}
		for _, r := range key {
			if unicode.IsControl(r) {
				return &ValidationError{Field: "key", Reason: "contains a control character"}
			}
		}
	}
	if !expiresAt.IsZero() && !sendAt.IsZero() && !expiresAt.After(sendAt) {
		return &ValidationError{Field: "expires_at", Reason: "not after the send time"}
	}
	return nil
}

// Message is one message of EnqueueBatch.
type Message struct {
	// To is the E.164 number to send to.
	To string
	// Body is the text.
	Body string
	// Priority is the message's priority; zero means Normal.
	Priority Priority
	// Key, when not empty, is the message's idempotency key (WithKey).
	Key string
	// SendAt and ExpiresAt are WithSendAt's and WithExpiresAt's times;
	// zero for none.
	SendAt, ExpiresAt time.Time
}

// enqueueSQL writes one message with a key through sendonce_enqueue
// (migration 0030): it inserts the row, or finds the one the key already
// names (and refuses another number or body), in one round trip.
const enqueueSQL = `SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4, $5, $6, $7)`

// enqueueTracedSQL is enqueueSQL with the caller's traceparent (migration
// 0033), named only when there is one, so that an untraced message is
// written by a database migrated before it as well.
const enqueueTracedSQL = `SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4, $5, $6, $7, $8)`

// insert returns the statement and arguments that write one message
// without a key. A message with no more than a number and a body names no
// other column, so that an application works against a database migrated
// before those columns as well.
func insert(id uuid.UUID, to, body string, o options) (string, []any) {
	switch {
	case o.traceparent != "":
		return `INSERT INTO sms_outbox (id, to_e164, body, priority, send_at, expires_at, traceparent) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			[]any{id, to, body, int16(o.priority), nullTime(o.sendAt), nullTime(o.expiresAt), o.traceparent}
	case !o.sendAt.IsZero() || !o.expiresAt.IsZero():
		return `INSERT INTO sms_outbox (id, to_e164, body, priority, send_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			[]any{id, to, body, int16(o.priority), nullTime(o.sendAt), nullTime(o.expiresAt)}
	case o.priority == Normal:
		return `INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, $3)`, []any{id, to, body}
	}
	return `INSERT INTO sms_outbox (id, to_e164, body, priority) VALUES ($1, $2, $3, $4)`, []any{id, to, body, int16(o.priority)}
}

// traceparent is the W3C Trace Context value of the span in ctx (the
// application's, where it traces with OpenTelemetry), which the relay
// and the senders continue; "" when ctx holds none.
func traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// keyedInsert returns the statement and arguments that write one message with a
// key: enqueueSQL, or enqueueTracedSQL for a traced one.
func keyedInsert(id uuid.UUID, to, body string, o options) (string, []any) {
	args := []any{id, to, body, o.key, int16(o.priority), nullTime(o.sendAt), nullTime(o.expiresAt)}
	if o.traceparent != "" {
		return enqueueTracedSQL, append(args, o.traceparent)
	}
	return enqueueSQL, args
}

// nullTime is t, or nil (SQL NULL) for the zero time.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// keyed maps the error of a keyed write: a unique violation there is the
// key naming another message (sendonce_enqueue raises it; an id collision
// of two minted UUIDs does not happen).
func keyed(err error) error {
	var st interface{ SQLState() string }
	if errors.As(err, &st) && st.SQLState() == "23505" {
		return fmt.Errorf("%w (nothing written)", ErrKeyReused)
	}
	return dbError("insert", err)
}

// Enqueue records the intent to send body to the E.164 number to, inside
// the application's transaction tx, and returns the message's id: its
// idempotency key for its whole life. The message is sent only if tx
// commits. Invalid input returns a *ValidationError before any SQL. With
// WithKey, a key that already names a message with the same number and
// body returns that message's id and writes nothing (see Created); with
// another, an error matching ErrKeyReused. When ctx holds an OpenTelemetry
// span, the message carries its W3C traceparent, and the relay and the
// senders continue that trace to the provider's request.
func Enqueue(ctx context.Context, tx pgx.Tx, to, body string, opts ...Option) (uuid.UUID, error) {
	return enqueue(ctx, func(query string, args []any, dest ...any) error {
		if len(dest) == 0 {
			_, err := tx.Exec(ctx, query, args...)
			return err
		}
		return tx.QueryRow(ctx, query, args...).Scan(dest...)
	}, to, body, opts)
}

// EnqueueSQL is Enqueue for database/sql: it writes the message inside tx,
// a transaction of any Postgres driver.
func EnqueueSQL(ctx context.Context, tx *sql.Tx, to, body string, opts ...Option) (uuid.UUID, error) {
	return enqueue(ctx, func(query string, args []any, dest ...any) error {
		if len(dest) == 0 {
			_, err := tx.ExecContext(ctx, query, args...)
			return err
		}
		return tx.QueryRowContext(ctx, query, args...).Scan(dest...)
	}, to, body, opts)
}

// statement runs one statement in the application's transaction, scanning
// its row into dest when dest is given: all that differs between the
// drivers Enqueue and EnqueueSQL write through.
type statement func(query string, args []any, dest ...any) error

func enqueue(ctx context.Context, run statement, to, body string, opts []Option) (uuid.UUID, error) {
	o, err := apply(opts)
	if err != nil {
		return uuid.Nil, err
	}
	id, err := newID(to, body)
	if err != nil {
		return uuid.Nil, err
	}
	o.traceparent = traceparent(ctx)
	if o.keyed {
		var created bool
		query, args := keyedInsert(id, to, body, o)
		if err := run(query, args, &id, &created); err != nil {
			return uuid.Nil, keyed(err)
		}
		o.setCreated(created)
		return id, nil
	}
	query, args := insert(id, to, body, o)
	if err := run(query, args); err != nil {
		return uuid.Nil, dbError("insert", err)
	}
	o.setCreated(true)
	return id, nil
}

func (o options) setCreated(created bool) {
	if o.created != nil {
		*o.created = created
	}
}

// CreatedEach sets *p, once EnqueueBatch succeeds, to whether it wrote
// each message, in the order of the batch: false for a message whose Key
// already named one.
func CreatedEach(p *[]bool) Option { return func(o *options) { o.createdEach = p } }

// EnqueueBatch records many messages inside tx in one statement (one round
// trip, and one wake-up of the relays) and returns their ids in the order
// of msgs. Every message is validated first: if one is invalid, nothing is
// written and the error, a *ValidationError wrapped with the message's
// index, says which. A message whose Key already names one with the same
// number and body gets that message's id (CreatedEach tells which); one
// with another number or body fails the batch with ErrKeyReused, and
// nothing is written. Two messages of one batch with the same key are one
// message.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, msgs []Message, opts ...Option) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	var bo options
	for _, opt := range opts {
		opt(&bo)
	}
	ids := make([]uuid.UUID, len(msgs))
	// [16]byte rather than uuid.UUID: pgx encodes it as a uuid without
	// going through a text form.
	raw := make([][16]byte, len(msgs))
	tos := make([]string, len(msgs))
	bodies := make([]string, len(msgs))
	prios := make([]int16, len(msgs))
	keys := make([]*string, len(msgs))
	sendAts := make([]*time.Time, len(msgs))
	expires := make([]*time.Time, len(msgs))
	allNormal, anyKey, anyTime := true, false, false
	for i, m := range msgs {
		p := m.Priority
		if p == 0 {
			p = Normal
		}
		if !p.Valid() {
			return nil, fmt.Errorf("message %d of the batch: %w", i, &ValidationError{Field: "priority", Reason: "not 1 (urgent), 2 (normal) or 3 (bulk)"})
		}
		if err := validateIntent(m.Key, m.Key != "", m.SendAt, m.ExpiresAt); err != nil {
			return nil, fmt.Errorf("message %d of the batch: %w", i, err)
		}
		id, err := newID(m.To, m.Body)
		if err != nil {
			return nil, fmt.Errorf("message %d of the batch: %w", i, err)
		}
		ids[i], raw[i], tos[i], bodies[i], prios[i] = id, id, m.To, m.Body, int16(p)
		if m.Key != "" {
			keys[i], anyKey = &msgs[i].Key, true
		}
		if !m.SendAt.IsZero() {
			sendAts[i], anyTime = &msgs[i].SendAt, true
		}
		if !m.ExpiresAt.IsZero() {
			expires[i], anyTime = &msgs[i].ExpiresAt, true
		}
		allNormal = allNormal && p == Normal
	}
	created := make([]bool, len(msgs))
	// One caller's span for the whole batch.
	tp := traceparent(ctx)
	var err error
	switch {
	case anyKey:
		query := `SELECT id, created FROM sendonce_enqueue_batch($1::uuid[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::timestamptz[], $7::timestamptz[])`
		args := []any{raw, tos, bodies, keys, prios, sendAts, expires}
		if tp != "" {
			query = `SELECT id, created FROM sendonce_enqueue_batch($1::uuid[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::timestamptz[], $7::timestamptz[], $8::text)`
			args = append(args, tp)
		}
		rows, _ := tx.Query(ctx, query, args...)
		i := 0
		var id uuid.UUID
		var c bool
		_, err = pgx.ForEachRow(rows, []any{&id, &c}, func() error {
			if i < len(ids) {
				ids[i], created[i] = id, c
			}
			i++
			return nil
		})
		if err != nil {
			return nil, keyed(err)
		}
		if i != len(ids) {
			return nil, fmt.Errorf("outbox: insert batch of %d: %d ids returned", len(msgs), i)
		}
	case tp != "":
		_, err = tx.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, priority, send_at, expires_at, traceparent)
			SELECT u.*, $7::text FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::timestamptz[], $6::timestamptz[]) AS u`,
			raw, tos, bodies, prios, sendAts, expires, tp)
	case anyTime:
		_, err = tx.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, priority, send_at, expires_at)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::timestamptz[], $6::timestamptz[])`,
			raw, tos, bodies, prios, sendAts, expires)
	case allNormal:
		_, err = tx.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[])`, raw, tos, bodies)
	default:
		_, err = tx.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, priority)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[])`, raw, tos, bodies, prios)
	}
	if err != nil {
		return nil, dbError(fmt.Sprintf("insert batch of %d", len(msgs)), err)
	}
	if !anyKey {
		for i := range created {
			created[i] = true
		}
	}
	if bo.createdEach != nil {
		*bo.createdEach = created
	}
	return ids, nil
}

// newID validates a message and mints its id: a version 7 UUID, which
// sorts by the time it was minted, so that a new row lands on the right
// edge of the primary key however large the table is.
func newID(to, body string) (uuid.UUID, error) {
	if err := Validate(to, body); err != nil {
		return uuid.Nil, err
	}
	id, err := uuid.NewV7()
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
		return MessageStatus{}, dbError("read status", err)
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

// cancelSQL cancels through sendonce_cancel (migration 0030), which the
// application's role may call: it returns the row's status after the call,
// or NULL when there is no such row.
const cancelSQL = `SELECT sendonce_cancel($1)`

// Cancel takes back the message id if no provider call has started for
// it: the message ends StatusCancelled, and no sender will call for it. It
// returns the message's status after the call: StatusCancelled, or what
// the message is when it is too late (StatusSending: a call is under way;
// StatusSent and later; StatusQueued when an earlier attempt may have
// reached the provider), unchanged. A cancel racing a sender's claim is
// decided by the database: the message is either cancelled and never
// called, or called and not cancelled. An id with no row returns
// ErrNotFound. Cancelling a cancelled message returns StatusCancelled.
//
// The cancel holds the message's row lock until db's transaction ends, and
// a sender that fetched the message waits for it meanwhile: call it on a
// pool (its own short transaction) or in a transaction that commits soon.
func Cancel(ctx context.Context, db Querier, id uuid.UUID) (State, error) {
	var st *string
	if err := db.QueryRow(ctx, cancelSQL, id).Scan(&st); err != nil {
		return "", dbError("cancel", err)
	}
	if st == nil {
		return "", ErrNotFound
	}
	return State(*st), nil
}

// CancelSQL is Cancel for database/sql.
func CancelSQL(ctx context.Context, db SQLQuerier, id uuid.UUID) (State, error) {
	var st sql.NullString
	if err := db.QueryRowContext(ctx, cancelSQL, id).Scan(&st); err != nil {
		return "", dbError("cancel", err)
	}
	if !st.Valid {
		return "", ErrNotFound
	}
	return State(st.String), nil
}
