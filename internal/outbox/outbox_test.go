package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/pgtest"
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
	pool, _ := pgtest.NewPool(t)
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
	pool, _ := pgtest.NewPool(t)
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

func TestRelayClaimSkipsLockedRows(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		enqueue(t, pool, "+15551234567", "x")
	}
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	first, err := outbox.ClaimPending(ctx, tx1, 6)
	if err != nil || len(first) != 6 {
		t.Fatalf("claim 1: %d rows, %v", len(first), err)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	second, err := outbox.ClaimPending(ctx, tx2, 6)
	if err != nil || len(second) != 4 {
		t.Fatalf("claim 2: %d rows, %v (want the 4 unlocked)", len(second), err)
	}
	seen := map[uuid.UUID]bool{}
	for _, p := range append(first, second...) {
		if seen[p.ID] {
			t.Fatalf("row %s claimed twice", p.ID)
		}
		seen[p.ID] = true
	}
	ids := make([]uuid.UUID, len(second))
	for i, p := range second {
		ids[i] = p.ID
	}
	if n, err := outbox.MarkQueued(ctx, tx2, ids, []int64{1, 2, 3, 4}); err != nil || n != 4 {
		t.Fatalf("MarkQueued = %d, %v", n, err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = tx1.Rollback(ctx)
	var pending, queued int
	_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status='pending'), count(*) FILTER (WHERE status='queued') FROM sms_outbox`).Scan(&pending, &queued)
	if pending != 6 || queued != 4 {
		t.Fatalf("pending=%d queued=%d, want 6 and 4 (a rolled-back claim returns rows)", pending, queued)
	}
}
