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
	"github.com/sendonce/sendonce/internal/pgtest"
	"github.com/sendonce/sendonce/internal/relay"
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
	claims, err := outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{retried}, time.Minute, uuid.New())
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
	claims, err = outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{retried}, time.Minute, uuid.New())
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
	claims, err = outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{retried}, time.Minute, uuid.New())
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
