package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/outbox"
)

// appPool is a pool whose every connection acts as the application's role,
// sendonce_app: what an application may do, and no more.
func appPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE sendonce_app`)
		return err
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// enqueueWith runs Enqueue with opts in a transaction of its own and
// returns the id, whether it wrote the row, and the error.
func enqueueWith(t *testing.T, pool *pgxpool.Pool, to, body string, opts ...outbox.Option) (uuid.UUID, bool, error) {
	t.Helper()
	var id uuid.UUID
	created := true
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(context.Background(), tx, to, body, append(opts, outbox.Created(&created))...)
		return err
	})
	return id, created, err
}

// A key names one intent: the second write of the same key with the same
// number and body writes nothing and returns the first id; with another
// number or body it is refused with ErrKeyReused, and nothing is written.
// The application's role does it through its grants alone.
func TestAKeyNamesOneMessage(t *testing.T) {
	t.Parallel()
	app := appPool(t)
	key := "signup:" + uuid.NewString()
	first, created, err := enqueueWith(t, app, "+15551230001", "Your code is 111111", outbox.WithKey(key))
	if err != nil || !created {
		t.Fatalf("first write: %v, created %v", err, created)
	}
	again, created, err := enqueueWith(t, app, "+15551230001", "Your code is 111111", outbox.WithKey(key))
	if err != nil || created || again != first {
		t.Fatalf("same key, same message: id %s (first %s), created %v, %v; want the first id, not created", again, first, created, err)
	}
	for _, m := range []struct{ to, body string }{{"+15551230002", "Your code is 111111"}, {"+15551230001", "Your code is 222222"}} {
		_, _, err := enqueueWith(t, app, m.to, m.body, outbox.WithKey(key))
		if !errors.Is(err, outbox.ErrKeyReused) {
			t.Fatalf("same key, another message: %v, want ErrKeyReused", err)
		}
		if strings.Contains(err.Error(), m.to) || strings.Contains(err.Error(), m.body) {
			t.Fatalf("the error carries the message: %v", err)
		}
	}
	var rows int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE idempotency_key = $1`, key).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows for the key, %v; want 1", rows, err)
	}

	// database/sql, and a plain INSERT ... ON CONFLICT DO NOTHING as
	// another language would write it: nothing written either way.
	sqlDB, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	ctx := context.Background()
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `SET LOCAL ROLE sendonce_app`); err != nil {
		t.Fatal(err)
	}
	var created2 bool
	viaSQL, err := outbox.EnqueueSQL(ctx, tx, "+15551230001", "Your code is 111111", outbox.WithKey(key), outbox.Created(&created2))
	if err != nil || viaSQL != first || created2 {
		t.Fatalf("EnqueueSQL with the key: %s, created %v, %v; want %s, not created", viaSQL, created2, err, first)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO sms_outbox (id, to_e164, body, idempotency_key) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
		uuid.NewString(), "+15551230009", "another", key)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 0 {
		t.Fatalf("a plain INSERT with a used key wrote %d rows", n)
	}
	var got uuid.UUID
	var gotCreated bool
	if err := tx.QueryRowContext(ctx, `SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4)`, uuid.NewString(), "+15551230001", "Your code is 111111", key).
		Scan(&got, &gotCreated); err != nil || got != first || gotCreated {
		t.Fatalf("sendonce_enqueue with the key: %s, %v, %v", got, gotCreated, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// A key is checked before any SQL: 1 to 255 characters, none a control
// character.
func TestKeyValidation(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "a\nb", "tab\there", strings.Repeat("k", outbox.MaxKeyChars+1), "\xff"} {
		_, _, err := enqueueWith(t, db, "+15551230003", "hello", outbox.WithKey(key))
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != "key" {
			t.Errorf("key %q: %v, want a ValidationError on key", key, err)
		}
	}
	if _, _, err := enqueueWith(t, db, "+15551230003", "hello", outbox.WithKey(strings.Repeat("é", outbox.MaxKeyChars))); err != nil {
		t.Errorf("a key of %d characters: %v", outbox.MaxKeyChars, err)
	}
	// The database refuses the same as another language would write it.
	_, err := db.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, idempotency_key) VALUES (gen_random_uuid(), '+15551230003', 'x', E'a\nb')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != "sms_outbox_idempotency_key_format" {
		t.Errorf("a control character in SQL: %v, want the key's format refused", err)
	}
}

// A batch with keys: a key already used gives back its message, two
// messages of the batch with one key are one message, a key used for
// another message fails the batch, and CreatedEach says which were new.
func TestEnqueueBatchWithKeys(t *testing.T) {
	t.Parallel()
	app := appPool(t)
	ctx := context.Background()
	k1, k2 := "batch:"+uuid.NewString(), "batch:"+uuid.NewString()
	old, _, err := enqueueWith(t, app, "+15551230010", "old", outbox.WithKey(k1))
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	var created []bool
	err = pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{
			{To: "+15551230010", Body: "old", Key: k1},
			{To: "+15551230011", Body: "new", Key: k2},
			{To: "+15551230011", Body: "new", Key: k2},
			{To: "+15551230012", Body: "unkeyed"},
		}, outbox.CreatedEach(&created))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != old || ids[1] != ids[2] || ids[3] == ids[1] || created[0] || !created[1] || created[2] || !created[3] {
		t.Fatalf("ids %v, created %v; want [old, new, new, other], [false true false true]", ids, created)
	}
	err = pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{
			{To: "+15551230013", Body: "fine", Key: "batch:" + uuid.NewString()},
			{To: "+15551230010", Body: "not the old text", Key: k1},
		})
		return err
	})
	if !errors.Is(err, outbox.ErrKeyReused) {
		t.Fatalf("a batch reusing a key for another message: %v, want ErrKeyReused", err)
	}
	// One id twice in a batch (another language's mistake) writes nothing
	// and says so, rather than report the second as written.
	dup := uuid.New()
	_, err = app.Exec(ctx, `SELECT * FROM sendonce_enqueue_batch($1, $2, $3, $4, $5, $6, $7)`,
		[]uuid.UUID{dup, dup}, []string{"+15551230014", "+15551230015"}, []string{"x", "y"}, []*string{nil, nil},
		[]int16{2, 2}, []*time.Time{nil, nil}, []*time.Time{nil, nil})
	if err == nil || !strings.Contains(err.Error(), "an id appears twice") {
		t.Fatalf("one id twice in a batch: %v", err)
	}
}

// A future send time makes the message scheduled; an expiry must come after
// it; both are refused before SQL when they do not fit, and by the table
// when another language writes them.
func TestScheduleAndExpiryAreWritten(t *testing.T) {
	t.Parallel()
	app := appPool(t)
	ctx := context.Background()
	at := time.Now().Add(time.Hour)
	id, _, err := enqueueWith(t, app, "+15551230020", "later", outbox.WithSendAt(at), outbox.WithExpiresAt(at.Add(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := outbox.Status(ctx, app, id)
	if err != nil || st.Status != outbox.StatusScheduled {
		t.Fatalf("a message for in an hour: %+v, %v; want scheduled", st, err)
	}
	now, _, err := enqueueWith(t, app, "+15551230021", "now", outbox.WithSendAt(time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := outbox.Status(ctx, app, now); err != nil || st.Status != outbox.StatusPending {
		t.Fatalf("a send time in the past: %+v, %v; want pending", st, err)
	}
	_, _, err = enqueueWith(t, app, "+15551230022", "bad", outbox.WithSendAt(at), outbox.WithExpiresAt(at))
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "expires_at" {
		t.Fatalf("an expiry at the send time: %v, want a ValidationError on expires_at", err)
	}
	_, err = app.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, send_at, expires_at) VALUES (gen_random_uuid(), '+15551230022', 'x', $1, $1)`, at)
	if err == nil || !strings.Contains(err.Error(), "expires_at must be after send_at") {
		t.Fatalf("the same in SQL: %v", err)
	}
	// The times are part of the intent: they never change.
	if _, err := db.Exec(ctx, `UPDATE sms_outbox SET send_at = now() WHERE id = $1`, id); err == nil {
		t.Fatal("send_at changed after the insert")
	}
}

// Cancel takes back a message no call has started for, says what a
// message is when it is too late, and changes nothing then.
func TestCancel(t *testing.T) {
	t.Parallel()
	app := appPool(t)
	ctx := context.Background()
	pending, _, err := enqueueWith(t, app, "+15551230030", "take me back")
	if err != nil {
		t.Fatal(err)
	}
	scheduled, _, err := enqueueWith(t, app, "+15551230031", "tomorrow", outbox.WithSendAt(time.Now().Add(24*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	sending, _, err := enqueueWith(t, app, "+15551230032", "in flight")
	if err != nil {
		t.Fatal(err)
	}
	doubt, _, err := enqueueWith(t, app, "+15551230033", "maybe taken")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE sms_outbox SET status = 'sending', attempt_count = 1, claim_id = gen_random_uuid(), lease_until = now() + interval '1 minute' WHERE id = $1`, sending); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE sms_outbox SET status = 'queued', attempt_count = 1, maybe_accepted = true WHERE id = $1`, doubt); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   uuid.UUID
		want outbox.State
	}{
		{pending, outbox.StatusCancelled}, {scheduled, outbox.StatusCancelled},
		{sending, outbox.StatusSending}, {doubt, outbox.StatusQueued},
		{pending, outbox.StatusCancelled},
	} {
		got, err := outbox.Cancel(ctx, app, tc.id)
		if err != nil || got != tc.want {
			t.Errorf("Cancel(%s) = %q, %v; want %q", tc.id, got, err, tc.want)
		}
		if st, err := outbox.Status(ctx, app, tc.id); err != nil || st.Status != tc.want {
			t.Errorf("after Cancel(%s): %+v, %v; want %q", tc.id, st, err, tc.want)
		}
	}
	if _, err := outbox.Cancel(ctx, app, uuid.New()); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("Cancel of no message: %v, want ErrNotFound", err)
	}
	sqlDB, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	if got, err := outbox.CancelSQL(ctx, sqlDB, sending); err != nil || got != outbox.StatusSending {
		t.Errorf("CancelSQL of a sending message: %q, %v", got, err)
	}
}
