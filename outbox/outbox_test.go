package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/trace"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/outbox"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, to, body string
		field          string // "" = valid
	}{
		{"ok", "+15551234567", "Your code is 482901", ""},
		{"shortest number", "+12", "x", ""},
		{"longest number", "+123456789012345", "x", ""},
		{"max body", "+15551234567", strings.Repeat("é", 1600), ""},
		{"no plus", "15551234567", "x", "to"},
		{"leading zero", "+05551234567", "x", "to"},
		{"too long", "+1234567890123456", "x", "to"},
		{"letters", "+1555ABC4567", "x", "to"},
		{"spaces", "+1 555 123 4567", "x", "to"},
		{"empty to", "", "x", "to"},
		{"empty body", "+15551234567", "", "body"},
		{"oversize body", "+15551234567", strings.Repeat("a", 1601), "body"},
		{"invalid utf8", "+15551234567", "\xff\xfe", "body"},
		{"nul", "+15551234567", "a\x00b", "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := outbox.Validate(tt.to, tt.body)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field || !errors.Is(err, outbox.ErrInvalid) {
				t.Fatalf("Validate = %v, want a ValidationError on %q", err, tt.field)
			}
			if tt.to != "" && strings.Contains(err.Error(), tt.to) {
				t.Fatalf("error %q echoes the phone number", err)
			}
		})
	}
}

func enqueue(t *testing.T, pool *pgxpool.Pool, to, body string) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(context.Background(), tx, to, body)
		return err
	})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return id
}

func TestEnqueueAndStatus(t *testing.T) {
	t.Parallel()
	pool := db
	ctx := context.Background()
	id := enqueue(t, pool, "+15551234567", "hello")
	st, err := outbox.Status(ctx, pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != outbox.StatusPending || st.Attempts != 0 || st.ID != id {
		t.Fatalf("Status = %+v", st)
	}
	if _, err := outbox.Status(ctx, pool, uuid.New()); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Status(unknown) = %v, want ErrNotFound", err)
	}

	// A rolled-back transaction leaves nothing behind: the intent exists
	// only if the business change commits.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolled, err := outbox.Enqueue(ctx, tx, "+15551234567", "never")
	if err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if _, err := outbox.Status(ctx, pool, rolled); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("rolled-back row: %v, want ErrNotFound", err)
	}
}

func TestDatabaseRefusesBadRows(t *testing.T) {
	t.Parallel()
	pool := db
	ctx := context.Background()
	insert := func(to, body string) error {
		_, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, $3)`, uuid.New(), to, body)
		return err
	}
	wantCheck := func(t *testing.T, err error, constraint string) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Fatalf("err = %v, want check_violation", err)
		}
		if constraint != "" && pgErr.ConstraintName != constraint {
			t.Fatalf("constraint = %q, want %q", pgErr.ConstraintName, constraint)
		}
	}
	t.Run("bad e164", func(t *testing.T) {
		for _, to := range []string{"5551234567", "+0123", "+1", "+1234567890123456", "+1 555", ""} {
			wantCheck(t, insert(to, "x"), "sms_outbox_to_e164_format")
		}
	})
	t.Run("empty body", func(t *testing.T) { wantCheck(t, insert("+15551234567", ""), "sms_outbox_body_length") })
	t.Run("oversize body", func(t *testing.T) {
		wantCheck(t, insert("+15551234567", strings.Repeat("a", 1601)), "sms_outbox_body_length")
	})
	t.Run("bad status", func(t *testing.T) {
		_, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status) VALUES ($1, '+15551234567', 'x', 'done')`, uuid.New())
		wantCheck(t, err, "sms_outbox_status_valid")
	})
	t.Run("intent is immutable", func(t *testing.T) {
		id := enqueue(t, pool, "+15551234567", "original")
		for _, stmt := range []string{
			`UPDATE sms_outbox SET body = 'changed' WHERE id = $1`,
			`UPDATE sms_outbox SET to_e164 = '+15550000000' WHERE id = $1`,
			`UPDATE sms_outbox SET id = gen_random_uuid() WHERE id = $1`,
		} {
			_, err := pool.Exec(ctx, stmt, id)
			wantCheck(t, err, "")
		}
		// Updating the same value is refused too? No: only a change is.
		if _, err := pool.Exec(ctx, `UPDATE sms_outbox SET body = body, status = 'queued' WHERE id = $1`, id); err != nil {
			t.Fatalf("unchanged intent with a status change: %v", err)
		}
		var body string
		if err := pool.QueryRow(ctx, `SELECT body FROM sms_outbox WHERE id = $1`, id).Scan(&body); err != nil || body != "original" {
			t.Fatalf("body = %q, %v", body, err)
		}
	})
	t.Run("edge rows accepted", func(t *testing.T) {
		if err := insert("+123456789012345", strings.Repeat("ü", 1600)); err != nil {
			t.Fatalf("1600 multibyte characters: %v", err)
		}
	})
}

// The database/sql variants write and read the same rows as the pgx ones.
func TestEnqueueSQLAndStatusSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sqlDB, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := outbox.EnqueueSQL(ctx, tx, "+15551234567", "hello over database/sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.EnqueueSQL(ctx, tx, "+15551234567", ""); !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("empty body: %v, want ErrInvalid", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	st, err := outbox.StatusSQL(ctx, sqlDB, id)
	if err != nil || st.ID != id || st.Status != outbox.StatusPending || st.ProviderRef != "" || st.CreatedAt.IsZero() {
		t.Fatalf("StatusSQL = %+v, %v", st, err)
	}
	if viaPgx, err := outbox.Status(ctx, db, id); err != nil || viaPgx != st {
		t.Fatalf("Status = %+v, %v; StatusSQL = %+v", viaPgx, err, st)
	}
	if _, err := db.Exec(ctx, `UPDATE sms_outbox SET status = 'sent', provider_ref = 'msg_1', last_error = 'http 503' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if st, err := outbox.StatusSQL(ctx, sqlDB, id); err != nil || st.Status != outbox.StatusSent || st.ProviderRef != "msg_1" || st.LastError != "http 503" {
		t.Fatalf("StatusSQL after send = %+v, %v", st, err)
	}
	if _, err := outbox.StatusSQL(ctx, sqlDB, uuid.New()); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("StatusSQL(unknown) = %v, want ErrNotFound", err)
	}
}

// A batch is one statement: one round trip, its rows committed together,
// in order.
func TestEnqueueBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	statements := &queryCounter{}
	cfg.ConnConfig.Tracer = statements
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	msgs := make([]outbox.Message, 250)
	for i := range msgs {
		msgs[i] = outbox.Message{To: "+1555000" + string(rune('0'+i%10)) + "000", Body: strings.Repeat("x", 1+i)}
	}
	var ids []uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		before := statements.n.Load()
		var err error
		ids, err = outbox.EnqueueBatch(ctx, tx, msgs)
		if n := statements.n.Load() - before; n != 1 {
			t.Errorf("EnqueueBatch sent %d statements, want 1", n)
		}
		return err
	})
	// Version 7, in the order minted: each batch lands on the right edge
	// of the primary key.
	for i, id := range ids {
		if id.Version() != 7 || i > 0 && bytes.Compare(id[:], ids[i-1][:]) <= 0 {
			t.Fatalf("id %d is %s (version %d) after %s: want version 7 ids, ascending", i, id, id.Version(), ids[max(i-1, 0)])
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(msgs) {
		t.Fatalf("%d ids for %d messages", len(ids), len(msgs))
	}
	for i, id := range ids {
		var to, body string
		if err := pool.QueryRow(ctx, `SELECT to_e164, body FROM sms_outbox WHERE id = $1`, id).Scan(&to, &body); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		if to != msgs[i].To || body != msgs[i].Body {
			t.Fatalf("row %d holds another message", i)
		}
	}

	// One invalid message refuses the whole batch, before any SQL, and
	// says which one.
	bad := append(msgs[:2:2], outbox.Message{To: "+15551234567", Body: ""})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = outbox.EnqueueBatch(ctx, tx, bad)
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "body" || !strings.Contains(err.Error(), "message 2 of the batch") {
		t.Fatalf("EnqueueBatch(bad) = %v", err)
	}
	if ids, err := outbox.EnqueueBatch(ctx, tx, nil); ids != nil || err != nil {
		t.Fatalf("EnqueueBatch(nil) = %v, %v", ids, err)
	}
}

// queryCounter counts the statements a pool sends.
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestStateTerminal(t *testing.T) {
	t.Parallel()
	for s, want := range map[outbox.State]bool{
		outbox.StatusPending: false, outbox.StatusQueued: false, outbox.StatusSending: false,
		outbox.StatusSent: true, outbox.StatusDelivered: true, outbox.StatusUndelivered: true,
		outbox.StatusDead: true, outbox.StatusUnknown: true, outbox.StatusScheduled: false,
		outbox.StatusExpired: true, outbox.StatusCancelled: true, outbox.StatusSuppressed: true, "": false,
	} {
		if got := s.Terminal(); got != want {
			t.Errorf("%q.Terminal() = %v, want %v", s, got, want)
		}
	}
}

// A message's priority is written with it, refused when out of range before
// any SQL, and, like the rest of the intent, never changes after the insert.
func TestPriority(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	var urgent, normal uuid.UUID
	var batch []uuid.UUID
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if urgent, err = outbox.Enqueue(ctx, tx, "+15551234567", "code 1", outbox.WithPriority(outbox.Urgent)); err != nil {
			return err
		}
		if normal, err = outbox.Enqueue(ctx, tx, "+15551234567", "hello"); err != nil {
			return err
		}
		batch, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{
			{To: "+15551234567", Body: "sale", Priority: outbox.Bulk},
			{To: "+15551234567", Body: "news"},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]int16{urgent: 1, normal: 2, batch[0]: 3, batch[1]: 2}
	for id, p := range want {
		var got int16
		if err := pool.QueryRow(ctx, `SELECT priority FROM sms_outbox WHERE id = $1`, id).Scan(&got); err != nil || got != p {
			t.Errorf("row %s: priority %d, %v; want %d", id, got, err, p)
		}
	}
	for _, bad := range []outbox.Priority{-1, 0, 4} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, "+15551234567", "x", outbox.WithPriority(bad))
			return err
		})
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != "priority" {
			t.Errorf("priority %d: %v, want a ValidationError on priority", bad, err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE sms_outbox SET priority = 1 WHERE id = $1`, normal); err == nil {
		t.Error("the database let a priority change")
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, priority) VALUES (gen_random_uuid(), '+15551234567', 'x', 7)`); err == nil {
		t.Error("the database took priority 7")
	}
}

// On a schema from before sendonce_status, Status reads the table, as
// earlier releases did, so applications can be upgraded before the schema;
// inside a transaction it cannot, and says so.
func TestStatusOnASchemaBeforeTheStatusFunction(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	var before []migrate.Migration
	for _, m := range migs {
		if m.Version < 10 {
			before = append(before, m)
		}
	}
	if _, err := migrate.Up(ctx, conn, before); err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		id, err = outbox.Enqueue(ctx, tx, "+15551234567", "hello")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := outbox.Status(ctx, conn, id); err != nil || st.Status != outbox.StatusPending {
		t.Fatalf("Status before 0010: %+v, %v", st, err)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := outbox.Status(ctx, tx, id)
		return err
	})
	if err == nil {
		t.Fatal("Status in a transaction before 0010 succeeded")
	}
}

// A message enqueued inside a span carries the span's W3C traceparent, by
// either driver, with a key or without, alone or in a batch; one enqueued
// outside any carries none.
func TestEnqueueCarriesTheCallersTrace(t *testing.T) {
	t.Parallel()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled,
	})
	traced := trace.ContextWithSpanContext(context.Background(), sc)
	const want = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sqlDB, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	var ids [9]uuid.UUID
	key := uuid.NewString()
	if err := pgx.BeginFunc(traced, db, func(tx pgx.Tx) error {
		var err error
		if ids[0], err = outbox.Enqueue(traced, tx, "+15551234567", "traced", outbox.WithPriority(outbox.Urgent)); err != nil {
			return err
		}
		if ids[1], err = outbox.Enqueue(context.Background(), tx, "+15551234567", "untraced"); err != nil {
			return err
		}
		// Through sendonce_enqueue and sendonce_enqueue_batch (a key), and
		// a batch without keys.
		if ids[3], err = outbox.Enqueue(traced, tx, "+15551234567", "traced with a key", outbox.WithKey(key+"-1")); err != nil {
			return err
		}
		if ids[4], err = outbox.Enqueue(context.Background(), tx, "+15551234567", "untraced with a key", outbox.WithKey(key+"-2")); err != nil {
			return err
		}
		batch, err := outbox.EnqueueBatch(traced, tx, []outbox.Message{{To: "+15551234567", Body: "keyed batch", Key: key + "-3"}, {To: "+15551234567", Body: "keyed batch, no key"}})
		if err != nil {
			return err
		}
		ids[5], ids[6] = batch[0], batch[1]
		if batch, err = outbox.EnqueueBatch(traced, tx, []outbox.Message{{To: "+15551234567", Body: "batch"}}); err != nil {
			return err
		}
		ids[7] = batch[0]
		batch, err = outbox.EnqueueBatch(context.Background(), tx, []outbox.Message{{To: "+15551234567", Body: "untraced batch", Key: key + "-4"}})
		ids[8] = batch[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tx, err := sqlDB.BeginTx(traced, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ids[2], err = outbox.EnqueueSQL(traced, tx, "+15551234567", "traced over database/sql"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for i, w := range []string{want, "", want, want, "", want, want, want, ""} {
		var got *string
		var prio int
		if err := db.QueryRow(context.Background(), `SELECT traceparent, priority FROM sms_outbox WHERE id = $1`, ids[i]).Scan(&got, &prio); err != nil {
			t.Fatal(err)
		}
		if (w == "") != (got == nil) || (got != nil && *got != w) || (i == 0 && prio != 1) {
			t.Errorf("message %d: traceparent %v, priority %d; want %q", i, got, prio, w)
		}
	}
}

// On a database never migrated, every call says to run relay migrate, as
// an error callers match with errors.Is, whichever driver.
func TestANeverMigratedDatabaseSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sqlDB, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	calls := map[string]func() error{
		"Enqueue": func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, "+15551234567", "hello")
				return err
			})
		},
		"Enqueue with a key": func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, "+15551234567", "hello", outbox.WithKey("k"))
				return err
			})
		},
		"EnqueueBatch": func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{{To: "+15551234567", Body: "hello"}})
				return err
			})
		},
		"EnqueueSQL": func() error {
			tx, err := sqlDB.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			_, err = outbox.EnqueueSQL(ctx, tx, "+15551234567", "hello")
			return err
		},
		"Status":    func() error { _, err := outbox.Status(ctx, pool, uuid.New()); return err },
		"StatusSQL": func() error { _, err := outbox.StatusSQL(ctx, sqlDB, uuid.New()); return err },
		"Cancel":    func() error { _, err := outbox.Cancel(ctx, pool, uuid.New()); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "run relay migrate") {
			t.Errorf("%s on a database never migrated: %v; want ErrNotMigrated", name, err)
		}
	}
}
