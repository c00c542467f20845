package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// forwardRow inserts, as the table's owner, a row in status with the
// columns a row in that status has, and returns its id.
func forwardRow(t *testing.T, owner *pgxpool.Pool, i int, status string) uuid.UUID {
	t.Helper()
	id := uuid.New()
	reason := map[string]any{"dead": "permanent", "unknown": "ambiguous"}[status]
	var letter any
	if reason != nil {
		letter = int64(1)
	}
	if _, err := owner.Exec(context.Background(), `INSERT INTO sms_outbox
		(id, to_e164, body, status, end_reason, letter_seq, provider_ref, sent_at, attempt_count, claim_id)
		VALUES ($1::uuid, $2, $3, $4::text, $5, $6,
		        CASE WHEN $4::text IN ('sent', 'delivered', 'undelivered') THEN 'ref-' || $1::uuid::text END,
		        CASE WHEN $4::text IN ('sent', 'delivered', 'undelivered') THEN now() END,
		        CASE WHEN $4::text = 'pending' THEN 0 ELSE 1 END,
		        CASE WHEN $4::text <> 'pending' THEN gen_random_uuid() END)`,
		id, testPhone(i), testBody(i), status, reason, letter); err != nil {
		t.Fatal(err)
	}
	return id
}

// refusedMove reports whether err is the database refusing a statement:
// for want of a grant (42501) or by a check or trigger (23514).
func refusedMove(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "23514")
}

// Statuses move forward only, whatever a component's login sends (I3), and
// a row's intent never changes (I4): each component's role running its own
// UPDATE of a delivered row back to pending or queued, of a sent row back
// to pending, of a dead row to delivered, or of a body is refused by the
// database, and the row is left as it was. Moves that one component makes
// are refused to the others (pending to delivered by the relay, a replay
// by the sender). Migration 0018.
func TestRolesCannotMoveStatusesBackwards(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewMigrated(t)
	owner := newPool(t, dbURL)
	ctx := context.Background()
	type move struct {
		name, from, sql string
	}
	every := []move{
		{"delivered to pending", "delivered", `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`},
		{"sent to pending", "sent", `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`},
		{"dead to delivered", "dead", `UPDATE sms_outbox SET status = 'delivered' WHERE id = $1`},
		{"delivered to queued", "delivered", `UPDATE sms_outbox SET status = 'queued' WHERE id = $1`},
		{"a body change", "sent", `UPDATE sms_outbox SET body = 'changed' WHERE id = $1`},
		{"undelivered to sending", "undelivered", `UPDATE sms_outbox SET status = 'sending' WHERE id = $1`},
		{"sent to queued", "sent", `UPDATE sms_outbox SET status = 'queued' WHERE id = $1`},
		{"sent to dead", "sent", `UPDATE sms_outbox SET status = 'dead' WHERE id = $1`},
		{"delivered to undelivered", "delivered", `UPDATE sms_outbox SET status = 'undelivered' WHERE id = $1`},
		{"a replay of a delivered row", "delivered", `UPDATE sms_outbox SET status = 'pending', publish_gen = publish_gen + 1 WHERE id = $1`},
	}
	roles := []struct {
		role  string
		moves []move
	}{
		{"sendonce_relay", []move{
			{"pending to delivered", "pending", `UPDATE sms_outbox SET status = 'delivered' WHERE id = $1`},
			{"queued to sent", "queued", `UPDATE sms_outbox SET status = 'sent' WHERE id = $1`},
			{"sending to sent", "sending", `UPDATE sms_outbox SET status = 'sent' WHERE id = $1`},
		}},
		{"sendonce_sender", []move{
			{"dead to pending (a replay)", "dead", `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`},
			{"unknown to pending (a replay)", "unknown", `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`},
			{"pending to queued", "pending", `UPDATE sms_outbox SET status = 'queued' WHERE id = $1`},
		}},
		{"sendonce_receiver", []move{
			{"dead to pending (a replay)", "dead", `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`},
			{"sent to delivered, by hand", "sent", `UPDATE sms_outbox SET status = 'delivered' WHERE id = $1`},
		}},
		{"sendonce_console", []move{
			{"dead to pending, unaudited", "dead", `UPDATE sms_outbox SET status = 'pending', publish_gen = publish_gen + 1 WHERE id = $1`},
			{"a publish generation", "dead", `UPDATE sms_outbox SET publish_gen = publish_gen + 1 WHERE id = $1`},
		}},
	}
	i := 0
	for _, r := range roles {
		pool := asRole(t, dbURL, r.role)
		for _, m := range append(append([]move{}, every...), r.moves...) {
			i++
			id := forwardRow(t, owner, i, m.from)
			var before string
			if err := owner.QueryRow(ctx, `SELECT row(o.*)::text FROM sms_outbox o WHERE id = $1`, id).Scan(&before); err != nil {
				t.Fatal(err)
			}
			_, err := pool.Exec(ctx, m.sql, id)
			if !refusedMove(err) {
				t.Errorf("%s, %s: err %v; want it refused", r.role, m.name, err)
			}
			var after string
			if err := owner.QueryRow(ctx, `SELECT row(o.*)::text FROM sms_outbox o WHERE id = $1`, id).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Errorf("%s, %s: the row changed", r.role, m.name)
			}
		}
	}
}

// sendonce_purge keeps every finished row for an hour at least, whoever
// calls it and whatever cutoff it is given: a shorter cutoff is refused
// with the floor named, and a row finished seconds ago stays. Migration
// 0018.
func TestPurgeKeepsFinishedRowsAnHour(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewMigrated(t)
	owner := newPool(t, dbURL)
	relayPool := asRole(t, dbURL, "sendonce_relay")
	ctx := context.Background()
	var recent []uuid.UUID
	for i, status := range []string{"sent", "delivered", "undelivered", "dead"} {
		id := forwardRow(t, owner, i, status)
		if _, err := owner.Exec(ctx, `UPDATE sms_outbox SET updated_at = now() - interval '5 seconds', finished_at = now() - interval '5 seconds' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		recent = append(recent, id)
	}
	old := forwardRow(t, owner, 9, "delivered")
	if _, err := owner.Exec(ctx, `UPDATE sms_outbox SET updated_at = now() - interval '61 minutes', finished_at = now() - interval '61 minutes' WHERE id = $1`, old); err != nil {
		t.Fatal(err)
	}
	for _, cutoff := range []string{"1 second", "59 minutes 59 seconds", "0.5 hours"} {
		for who, pool := range map[string]*pgxpool.Pool{"relay": relayPool, "owner": owner} {
			_, err := pool.Exec(ctx, `SELECT sendonce_purge($1::interval, 100)`, cutoff)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.Contains(pgErr.Message, "1 hour") {
				t.Errorf("%s purged with a cutoff of %s: err %v; want invalid_parameter_value naming the floor of 1 hour", who, cutoff, err)
			}
		}
	}
	var n int64
	if err := relayPool.QueryRow(ctx, `SELECT sendonce_purge('1 hour', 100)`).Scan(&n); err != nil || n != 1 {
		t.Errorf("purge of the rows older than an hour: %d, %v; want 1", n, err)
	}
	var left int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE id = ANY($1)`, recent).Scan(&left); err != nil || left != len(recent) {
		t.Errorf("%d of the %d rows finished seconds ago are left (%v)", left, len(recent), err)
	}
}

// Each component still makes every move of the map in migration 0018, as
// its own role and through its own statements: the trigger refuses none
// of them, and the receiver's and the console's functions make theirs.
func TestRolesMakeTheirOwnMoves(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewMigrated(t)
	owner := newPool(t, dbURL)
	relayPool := asRole(t, dbURL, "sendonce_relay")
	senderPool := asRole(t, dbURL, "sendonce_sender")
	receiverPool := asRole(t, dbURL, "sendonce_receiver")
	consolePool := asRole(t, dbURL, "sendonce_console")
	ctx := context.Background()
	i := 0
	row := func(status string) uuid.UUID {
		t.Helper()
		i++
		return forwardRow(t, owner, i, status)
	}
	token := func(id uuid.UUID) uuid.UUID {
		t.Helper()
		var tok uuid.UUID
		if err := owner.QueryRow(ctx, `SELECT claim_id FROM sms_outbox WHERE id = $1`, id).Scan(&tok); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	check := func(who, move string, id uuid.UUID, want outbox.State, err error) {
		t.Helper()
		var got outbox.State
		if err == nil {
			err = owner.QueryRow(ctx, `SELECT status FROM sms_outbox WHERE id = $1`, id).Scan(&got)
		}
		if err != nil || got != want {
			t.Errorf("%s, %s: %v, the row is %s; want %s", who, move, err, got, want)
		}
	}
	in := func(pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, pool, fn)
	}
	write := func(r outbox.Result) error {
		return in(senderPool, func(tx pgx.Tx) error {
			w, err := outbox.ApplyResults(ctx, tx, []outbox.Result{r}, nil, false)
			if _, ok := w[r.ID]; err == nil && !ok {
				err = errors.New("not applied")
			}
			return err
		})
	}

	// The relay.
	id := row("pending")
	check("relay", "pending -> queued (publish)", id, outbox.StatusQueued, in(relayPool, func(tx pgx.Tx) error {
		ps, err := outbox.ClaimPending(ctx, tx, 100)
		if err != nil {
			return err
		}
		var ids []uuid.UUID
		var seqs []int64
		for k, p := range ps {
			ids, seqs = append(ids, p.ID), append(seqs, int64(k+1))
		}
		_, err = outbox.MarkQueued(ctx, tx, ids, seqs)
		return err
	}))
	for _, from := range []string{"queued", "sending"} {
		for _, to := range []outbox.State{outbox.StatusDead, outbox.StatusUnknown} {
			// The reconciler ends only a row whose attempts are spent
			// (migration 0026).
			id := row(from)
			if _, err := owner.Exec(ctx, `UPDATE sms_outbox SET attempt_count = max_attempts WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
			check("relay", from+" -> "+string(to)+" (reconciler)", id, to, in(relayPool, func(tx pgx.Tx) error {
				return outbox.Finalize(ctx, tx, outbox.Stuck{ID: id, Status: outbox.State(from), Attempts: 1, MaxAttempts: 1}, to, "max_attempts", "spent")
			}))
		}
	}
	for _, to := range []outbox.State{outbox.StatusSent, outbox.StatusDelivered, outbox.StatusUndelivered, outbox.StatusDead} {
		id := row("unknown")
		check("relay", "unknown -> "+string(to)+" (resolve)", id, to, in(relayPool, func(tx pgx.Tx) error {
			_, err := outbox.Settle(ctx, tx, id, 0, outbox.Settlement{Status: to, ProviderRef: "msg_x",
				Lookup: outbox.Evidence{Result: "found", Source: "resolve"}})
			return err
		}))
	}
	for _, from := range []string{"dead", "unknown"} {
		id := row(from)
		check("relay", from+" -> pending (relay dlq replay)", id, outbox.StatusPending, in(relayPool, func(tx pgx.Tx) error {
			rs, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: id}}, outbox.ReplayOptions{Force: true})
			if err == nil && (len(rs) != 1 || !rs[0].Replayed) {
				err = fmt.Errorf("replay: %+v", rs)
			}
			return err
		}))
	}

	// The sender.
	id = row("pending")
	claims, err := outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{id}, nil, time.Minute, uuid.New())
	check("sender", "pending -> sending (claim)", id, outbox.StatusSending, err)
	check("sender", "sending -> queued (retry)", id, outbox.StatusQueued,
		write(outbox.Result{ID: id, Status: outbox.StatusQueued, Error: "503", Token: claims[0].Token}))
	claims, err = outbox.ClaimForSend(ctx, senderPool, []uuid.UUID{id}, nil, time.Minute, uuid.New())
	check("sender", "queued -> sending (claim)", id, outbox.StatusSending, err)
	check("sender", "sending -> sent", id, outbox.StatusSent, write(outbox.Result{ID: id, Status: outbox.StatusSent, ProviderRef: "msg_1"}))
	check("sender", "sent -> delivered (overdue sweep)", id, outbox.StatusDelivered, in(senderPool, func(tx pgx.Tx) error {
		_, err := outbox.RecordOverdueLooks(ctx, tx, []outbox.OverdueLook{{ID: id, Fate: outbox.StatusDelivered,
			Lookup: outbox.Evidence{Result: "found", Source: "sender", ReceivedAt: time.Now()}}})
		return err
	}))
	id = row("sent")
	check("sender", "sent -> undelivered (lookup)", id, outbox.StatusUndelivered, write(outbox.Result{ID: id, Status: outbox.StatusUndelivered}))
	for _, to := range []outbox.State{outbox.StatusDead, outbox.StatusUnknown} {
		id := row("sending")
		check("sender", "sending -> "+string(to), id, to, write(outbox.Result{ID: id, Status: to, Reason: "permanent", Error: "x", Token: token(id)}))
	}
	id = row("unknown")
	check("sender", "unknown -> dead (lookup found none)", id, outbox.StatusDead,
		write(outbox.Result{ID: id, Status: outbox.StatusDead, Reason: "permanent", Error: "x", Token: token(id), NotAccepted: true}))
	id = row("dead")
	check("sender", "dead -> unknown (a claim's own dead row, maybe accepted)", id, outbox.StatusUnknown,
		write(outbox.Result{ID: id, Status: outbox.StatusDead, Reason: "permanent", Error: "x", Token: token(id), MaybeAccepted: true}))
	for _, from := range []string{"pending", "queued", "sending", "unknown", "dead"} {
		id := row(from)
		check("sender", from+" -> sent (the provider's answer)", id, outbox.StatusSent, write(outbox.Result{ID: id, Status: outbox.StatusSent, ProviderRef: "msg_2"}))
	}
	for _, from := range []string{"pending", "queued", "sending", "unknown"} {
		id := row(from)
		check("sender", from+" -> delivered (lookup)", id, outbox.StatusDelivered, write(outbox.Result{ID: id, Status: outbox.StatusDelivered, ProviderRef: "msg_3"}))
	}

	// The receiver, through sendonce_apply_receipts: rows a provider was
	// asked to send (a pending row never claimed takes no receipt,
	// migration 0025).
	for _, c := range []struct {
		from string
		to   outbox.State
	}{{"queued", outbox.StatusSent}, {"unknown", outbox.StatusDelivered}, {"sent", outbox.StatusDelivered},
		{"sending", outbox.StatusUndelivered}, {"dead", outbox.StatusUndelivered}, {"dead", outbox.StatusSent}} {
		id := row(c.from)
		check("receiver", c.from+" -> "+string(c.to)+" (receipt)", id, c.to, in(receiverPool, func(tx pgx.Tx) error {
			rs, err := outbox.ApplyReceipts(ctx, tx, []outbox.Receipt{{ID: id, Status: c.to, ProviderRef: "ref-" + id.String(), Source: "generic"}})
			if err == nil && (len(rs) != 1 || !rs[0].Applied) {
				err = fmt.Errorf("receipt: %+v", rs)
			}
			return err
		}))
	}

	// The console, through sendonce_replay_rows and sendonce_console_replay:
	// dead rows only (an unknown row's safety rests on the provider's
	// idempotency, which the row does not record).
	for _, from := range []string{"dead"} {
		id := row(from)
		audit := outbox.ConsoleReplay{User: "alice", Role: "operator", Requested: []uuid.UUID{id}}
		check("console", from+" -> pending (replay)", id, outbox.StatusPending, in(consolePool, func(tx pgx.Tx) error {
			rs, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: id, SafeUnknown: true}}, outbox.ReplayOptions{Audit: &audit})
			if err == nil && (len(rs) != 1 || !rs[0].Replayed || audit.ID == 0 || len(audit.Replayed) != 1) {
				err = fmt.Errorf("replay: %+v, audit %+v", rs, audit)
			}
			return err
		}))
	}
}

// The trigger's exemption is the table's owner as Postgres knows it when
// the trigger runs, not a superuser: with a database migrated by an owner
// that is no superuser (managed Postgres), the owner itself and the
// receiver's function (which runs as that owner) move what they must,
// and a component role is still refused.
func TestForwardOnlyUnderAnOwnerThatIsNoSuperuser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newPool(t, pgtest.AdminURL())
	suffix := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	ownerRole, db := "sendonce_owner_"+suffix, "sendonce_fwd_"+suffix
	for _, sql := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB`, ownerRole),
		fmt.Sprintf(`CREATE DATABASE %s OWNER %s`, db, ownerRole),
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, db))
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP ROLE IF EXISTS %s`, ownerRole))
	})
	adminURL := pgtest.WithDatabase(pgtest.AdminURL(), db)
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(ownerRole)
	if err := pgtest.Migrate(ctx, u.String()); err != nil {
		t.Fatal(err)
	}
	owner := newPool(t, u.String())
	var super bool
	if err := owner.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil || super {
		t.Fatalf("the owner is a superuser (%v)", err)
	}
	delivered := forwardRow(t, owner, 1, "delivered")
	if _, err := asRole(t, adminURL, "sendonce_relay").Exec(ctx, `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`, delivered); !refusedMove(err) {
		t.Errorf("the relay moved delivered to pending: %v", err)
	}
	dead := forwardRow(t, owner, 2, "dead")
	err = pgx.BeginFunc(ctx, asRole(t, adminURL, "sendonce_receiver"), func(tx pgx.Tx) error {
		rs, err := outbox.ApplyReceipts(ctx, tx, []outbox.Receipt{{ID: dead, Status: outbox.StatusDelivered, Source: "generic"}})
		if err == nil && (len(rs) != 1 || !rs[0].Applied) {
			err = fmt.Errorf("receipt: %+v", rs)
		}
		return err
	})
	if err != nil {
		t.Errorf("a receipt over a dead row, through the function owned by an owner that is no superuser: %v", err)
	}
	// The owner itself (a data migration, an administrator's repair).
	if _, err := owner.Exec(ctx, `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`, delivered); err != nil {
		t.Errorf("the owner, no superuser, was refused: %v", err)
	}
}

// A console login calling the console's replay function itself, past the
// console's own checks, still cannot put an unknown row back to pending:
// whether that sends the message twice depends on the provider's
// idempotency, which the row does not record. A dead row it may replay.
func TestTheConsoleCannotReplayAnUnknownRow(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewMigrated(t)
	owner := newPool(t, dbURL)
	consolePool := asRole(t, dbURL, "sendonce_console")
	ctx := context.Background()
	for i, c := range []struct {
		from, want string
	}{{"unknown", "unknown"}, {"dead", "pending"}} {
		id := forwardRow(t, owner, 100+i, c.from)
		if _, err := consolePool.Exec(ctx, `SELECT * FROM sendonce_console_replay('mallory', 'operator', ARRAY[$1::uuid], ARRAY[$1::uuid], '')`, id); err != nil {
			t.Fatalf("%s: %v", c.from, err)
		}
		var st string
		if err := owner.QueryRow(ctx, `SELECT status FROM sms_outbox WHERE id = $1`, id).Scan(&st); err != nil || st != c.want {
			t.Errorf("%s row after the console's function: %q, %v; want %s", c.from, st, err, c.want)
		}
	}
}
