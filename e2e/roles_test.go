package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	app "github.com/sendonce/sendonce/outbox"
)

// asRole returns the database URL with every connection acting as role, as
// a login role that is a member of it would.
func asRole(t *testing.T, dbURL, role string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, pgtest.AsRole(t, dbURL, role))
}

// Each component runs as its own least-privilege role, and a statement
// outside its grants is refused.
func TestComponentsRunAsTheirRoles(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	dbURL := e.dbURL()
	appPool := asRole(t, dbURL, "sendonce_app")
	relayPool := asRole(t, dbURL, "sendonce_relay")
	senderPool := asRole(t, dbURL, "sendonce_sender")
	receiverPool := asRole(t, dbURL, "sendonce_receiver")

	relayEnv := *e
	relayEnv.pool = relayPool
	_, stopRelay := relayEnv.startRelay(relay.Config{})
	senderEnv := *e
	senderEnv.pool = senderPool
	stopSender := senderEnv.startSender(senderOptions{})

	ctx := context.Background()
	var ids []uuid.UUID
	for i := range 20 {
		err := pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
			id, err := app.Enqueue(ctx, tx, testPhone(i), testBody(i))
			ids = append(ids, id)
			return err
		})
		if err != nil {
			t.Fatalf("the app role cannot enqueue: %v", err)
		}
	}
	err := pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
		var batch []app.Message
		for i := 20; i < 30; i++ {
			batch = append(batch, app.Message{To: testPhone(i), Body: testBody(i)})
		}
		batchIDs, err := app.EnqueueBatch(ctx, tx, batch)
		ids = append(ids, batchIDs...)
		return err
	})
	if err != nil {
		t.Fatalf("the app role cannot enqueue a batch: %v", err)
	}
	rows := e.waitTerminal(ids, time.Minute)
	for _, id := range ids {
		if rows[id].status != outbox.StatusSent {
			t.Fatalf("row %s ended %s", id, rows[id].status)
		}
		st, err := app.Status(ctx, appPool, id)
		if err != nil || st.Status != outbox.StatusSent {
			t.Fatalf("the app role cannot read the status: %+v %v", st, err)
		}
	}
	e.checkOnce(ids, rows)
	stopSender()
	stopRelay()

	// A retry write (which also records maybe_accepted), as the sender: the
	// pipeline above had no failure to retry.
	var retried uuid.UUID
	if err := pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
		var err error
		retried, err = app.Enqueue(ctx, tx, testPhone(99), testBody(99))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	claims, err := outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{retried}, nil, time.Minute, uuid.New())
	if err != nil || len(claims) != 1 || claims[0].Result != outbox.Claimed {
		t.Fatalf("the sender role cannot claim: %+v, %v", claims, err)
	}
	writeAs := func(what string, r outbox.Result) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, senderPool, func(tx pgx.Tx) error {
			applied, err := outbox.ApplyResults(ctx, tx, []outbox.Result{r}, nil, true)
			if _, ok := applied[r.ID]; err == nil && !ok {
				err = errors.New("not applied")
			}
			return err
		}); err != nil {
			t.Errorf("the sender role cannot write %s: %v", what, err)
		}
	}
	writeAs("a parked retry", outbox.Result{ID: retried, Status: outbox.StatusQueued, Error: "no response after the request was sent",
		RetryIn: time.Minute, Park: true, Token: claims[0].Token, MaybeAccepted: true})
	if _, err := relayPool.Exec(ctx, `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, retried); err != nil {
		t.Fatal(err)
	}
	claims, err = outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{retried}, nil, time.Minute, uuid.New())
	if err != nil || len(claims) != 1 || claims[0].Result != outbox.Claimed {
		t.Fatalf("the sender role cannot claim again: %+v, %v", claims, err)
	}
	// A lookup that failed, as the sender: the lookup stays pending, the
	// evidence is recorded.
	writeAs("a failed lookup", outbox.Result{ID: retried, Status: outbox.StatusQueued, Error: "lookup failed", RetryIn: time.Second,
		Token: claims[0].Token, MaybeAccepted: true, Refund: true, LookupPending: true, LookupFailed: true, NotAccepted: false,
		Lookup: &outbox.Evidence{Result: "failed", Detail: "lookup failed: http 500", ReceivedAt: time.Now(), Source: "sender"}})
	if _, err := relayPool.Exec(ctx, `UPDATE sms_outbox SET next_attempt_at = now() WHERE id = $1`, retried); err != nil {
		t.Fatal(err)
	}
	claims, err = outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{retried}, nil, time.Minute, uuid.New())
	if err != nil || len(claims) != 1 || !claims[0].LookupPending || claims[0].Lookups != 1 {
		t.Fatalf("the sender role's claim after a failed lookup: %+v, %v", claims, err)
	}
	writeAs("an unknown outcome", outbox.Result{ID: retried, Status: outbox.StatusUnknown, Reason: "ambiguous", Error: "x", Token: claims[0].Token})
	if err := outbox.MarkLettered(ctx, senderPool, []outbox.Lettered{{ID: retried, Seq: 1}}); err != nil {
		t.Errorf("the sender role cannot record a dead letter: %v", err)
	}
	// The reconciler's work, as the relay: stuck rows, rows without their
	// letter, and an operator replay.
	if err := pgx.BeginFunc(ctx, relayPool, func(tx pgx.Tx) error {
		if _, err := outbox.ClaimStuck(ctx, tx, time.Minute, [3]uint64{}, 0, 10); err != nil {
			return err
		}
		if _, err := outbox.ClaimUnlettered(ctx, tx, 0, 10); err != nil {
			return err
		}
		if err := outbox.MarkLettered(ctx, tx, []outbox.Lettered{{ID: retried, Seq: 1}}); err != nil {
			return err
		}
		res, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: retried}}, outbox.ReplayOptions{Force: true})
		if err == nil && (len(res) != 1 || !res[0].Replayed) {
			err = fmt.Errorf("replay = %+v", res)
		}
		return err
	}); err != nil {
		t.Errorf("the relay role cannot reconcile or replay: %v", err)
	}

	refused := []struct {
		pool *pgxpool.Pool
		who  string
		sql  string
	}{
		{appPool, "app", `SELECT body FROM sms_outbox LIMIT 1`},
		{appPool, "app", `UPDATE sms_outbox SET status = 'sent'`},
		{appPool, "app", `DELETE FROM sms_outbox`},
		{appPool, "app", `SELECT status, last_error FROM sms_outbox LIMIT 1`},
		{appPool, "app", `SELECT sendonce_purge('1 hour', 10)`},
		{relayPool, "relay", `DELETE FROM sms_outbox`},
		{relayPool, "relay", `DELETE FROM sms_attempts`},
		{senderPool, "sender", `SELECT sendonce_purge('1 hour', 10)`},
		{relayPool, "relay", `SELECT to_e164 FROM sms_outbox LIMIT 1`},
		{relayPool, "relay", `SELECT body FROM sms_outbox LIMIT 1`},
		{relayPool, "relay", `UPDATE sms_outbox SET body = 'x'`},
		{relayPool, "relay", `DELETE FROM sms_evidence`},
		{receiverPool, "receiver", `SELECT to_e164 FROM sms_outbox LIMIT 1`},
		{receiverPool, "receiver", `SELECT body FROM sms_outbox LIMIT 1`},
		{receiverPool, "receiver", `UPDATE sms_outbox SET attempt_count = 0`},
		{receiverPool, "receiver", `UPDATE sms_outbox SET publish_gen = 0`},
		{receiverPool, "receiver", `DELETE FROM sms_outbox`},
		{receiverPool, "receiver", `DELETE FROM sms_evidence`},
		{receiverPool, "receiver", `SELECT * FROM sms_attempts LIMIT 1`},
		{receiverPool, "receiver", `INSERT INTO sms_outbox (id, to_e164, body) VALUES (gen_random_uuid(), '+15550000000', 'x')`},
		{relayPool, "relay", `INSERT INTO sms_outbox (id, to_e164, body) VALUES (gen_random_uuid(), '+15550000000', 'x')`},
		{senderPool, "sender", `DELETE FROM sms_outbox`},
		{senderPool, "sender", `UPDATE sms_outbox SET body = 'changed'`},
		{senderPool, "sender", `INSERT INTO sms_outbox (id, to_e164, body) VALUES (gen_random_uuid(), '+15550000000', 'x')`},
		{senderPool, "sender", `DELETE FROM sms_attempts`},
		{senderPool, "sender", `DROP TABLE sms_attempts`},
	}
	for _, r := range refused {
		_, err := r.pool.Exec(ctx, r.sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "42501" && pgErr.Code != "42P01") {
			t.Errorf("%s ran %q: err %v, want insufficient_privilege", r.who, r.sql, err)
		}
	}
}

// The relay deletes only through sendonce_purge, which removes finished rows
// and nothing else; the application reads a row's status only through
// sendonce_status, by the row's id.
func TestPurgeAndStatusThroughFunctions(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewMigrated(t)
	owner := newPool(t, dbURL)
	appPool := asRole(t, dbURL, "sendonce_app")
	relayPool := asRole(t, dbURL, "sendonce_relay")
	ctx := context.Background()

	// One row per case, each last changed two hours ago but "recent".
	type kase struct {
		name, status string
		letter       bool
		recent       bool
		purged       bool
	}
	cases := []kase{
		{name: "pending", status: "pending"},
		{name: "queued", status: "queued"},
		{name: "sending", status: "sending"},
		{name: "unknown", status: "unknown"},
		{name: "dead without its letter", status: "dead"},
		{name: "sent recently", status: "sent", recent: true},
		{name: "sent", status: "sent", purged: true},
		{name: "delivered", status: "delivered", purged: true},
		{name: "undelivered", status: "undelivered", purged: true},
		{name: "dead with its letter", status: "dead", letter: true, purged: true},
	}
	ids := make([]uuid.UUID, len(cases))
	for i, c := range cases {
		ids[i] = uuid.New()
		updated := time.Now().Add(-2 * time.Hour)
		if c.recent {
			updated = time.Now()
		}
		var letter *int64
		if c.letter {
			letter = new(int64)
		}
		reason := map[string]any{"dead": "permanent", "unknown": "ambiguous"}[c.status]
		// A finished row finished when it last changed (finished_at is the
		// database's to write: the owner inserts it here).
		if _, err := owner.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, updated_at, letter_seq, end_reason, last_error, finished_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 'x', CASE WHEN $4 IN ('sent', 'delivered', 'undelivered', 'dead') THEN $5::timestamptz END)`,
			ids[i], testPhone(i), testBody(i), c.status, updated, letter, reason); err != nil {
			t.Fatal(err)
		}
		if _, err := owner.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome) VALUES ($1, 1, now(), 'retry')`, ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	pending := ids[0]

	refused := func(pool *pgxpool.Pool, who, sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s ran %q: err %v, want insufficient_privilege", who, sql, err)
		}
	}
	refused(relayPool, "relay", `DELETE FROM sms_outbox WHERE id = $1`, pending)
	refused(relayPool, "relay", `DELETE FROM sms_attempts WHERE outbox_id = $1`, pending)
	refused(appPool, "app", `SELECT status, last_error FROM sms_outbox WHERE id = $1`, ids[6])

	// The application reads the status of a row by its id, and of no row
	// without one.
	st, err := app.Status(ctx, appPool, ids[6])
	if err != nil || st.ID != ids[6] || st.Status != outbox.StatusSent || st.LastError != "x" {
		t.Fatalf("Status as the app: %+v, %v", st, err)
	}
	if _, err := app.Status(ctx, appPool, uuid.New()); !errors.Is(err, app.ErrNotFound) {
		t.Fatalf("Status of a missing row as the app: %v, want ErrNotFound", err)
	}
	if err := pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
		_, err := app.Status(ctx, tx, ids[0])
		return err
	}); err != nil {
		t.Fatalf("Status in a transaction as the app: %v", err)
	}

	// The function refuses what the retention rule does not allow.
	for _, sql := range []string{`SELECT sendonce_purge('0', 10)`, `SELECT sendonce_purge('-1 hour', 10)`,
		`SELECT sendonce_purge('1 hour', 0)`, `SELECT sendonce_purge('1 hour', 10001)`} {
		_, err := relayPool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
			t.Errorf("relay ran %q: err %v, want invalid_parameter_value", sql, err)
		}
	}

	// Two batches of at most 3: every finished row older than the hour,
	// with its attempts; nothing else.
	var total int64
	for range 3 {
		n, err := outbox.Purge(ctx, relayPool, time.Hour, 3)
		if err != nil {
			t.Fatalf("purge as the relay: %v", err)
		}
		total += n
	}
	if total != 4 {
		t.Errorf("purged %d rows, want 4", total)
	}
	for i, c := range cases {
		var rows, attempts int
		if err := owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM sms_outbox WHERE id = $1),
			(SELECT count(*) FROM sms_attempts WHERE outbox_id = $1)`, ids[i]).Scan(&rows, &attempts); err != nil {
			t.Fatal(err)
		}
		if gone := rows == 0 && attempts == 0; gone != c.purged || (rows == 1) != (attempts == 1) {
			t.Errorf("%s row: %d rows, %d attempts left; want purged %v", c.name, rows, attempts, c.purged)
		}
	}
}
