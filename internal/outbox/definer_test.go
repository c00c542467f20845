package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// rolePool returns a pool on url whose every connection acts as role, as
// a login IN ROLE role would.
func rolePool(t *testing.T, url, role string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, url, role))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// planted are the functions, aggregates and operators an application's
// login plants in a schema where it may create (a database upgraded from
// Postgres 14 or earlier keeps CREATE on public for PUBLIC), each a better
// match than the built-in one for a call the database's own functions make
// unqualified: cardinality, unnest, count and array_agg of uuid[] and
// text[], and equality of the number's and the body's domains. Each copies
// every number and body it can read into sendonce_loot and disables the
// forward-only trigger; run as the table's owner, it can do both.
var planted = []string{
	`CREATE TABLE public.sendonce_loot (who text, what text)`,
	`GRANT SELECT, INSERT ON public.sendonce_loot TO PUBLIC`,
	`CREATE FUNCTION public.sendonce_take() RETURNS void LANGUAGE plpgsql AS $$
	BEGIN
		BEGIN
			INSERT INTO public.sendonce_loot
			SELECT current_user::text, string_agg(to_e164::text || ' ' || body::text, ', ') FROM public.sms_outbox;
			EXECUTE 'ALTER TABLE public.sms_outbox DISABLE TRIGGER sms_outbox_forward_only';
		EXCEPTION WHEN insufficient_privilege OR undefined_object THEN
			INSERT INTO public.sendonce_loot VALUES (current_user::text, NULL);
		END;
	END $$`,
	`CREATE FUNCTION public.cardinality(uuid[]) RETURNS integer LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN pg_catalog.cardinality($1); END $$`,
	`CREATE FUNCTION public.cardinality(text[]) RETURNS integer LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN pg_catalog.cardinality($1); END $$`,
	`CREATE FUNCTION public.unnest(uuid[]) RETURNS SETOF uuid LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN QUERY SELECT * FROM pg_catalog.unnest($1); END $$`,
	`CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN QUERY SELECT * FROM pg_catalog.unnest($1); END $$`,
	`CREATE FUNCTION public.sendonce_count(bigint, uuid) RETURNS bigint LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN $1 + 1; END $$`,
	`CREATE AGGREGATE public.count(uuid) (SFUNC = public.sendonce_count, STYPE = bigint, INITCOND = '0')`,
	`CREATE FUNCTION public.sendonce_agg(uuid[], uuid) RETURNS uuid[] LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN pg_catalog.array_append($1, $2); END $$`,
	`CREATE AGGREGATE public.array_agg(uuid) (SFUNC = public.sendonce_agg, STYPE = uuid[])`,
	`CREATE FUNCTION public.sendonce_body_eq(sendonce_body, sendonce_body) RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN true; END $$`,
	`CREATE OPERATOR public.= (LEFTARG = sendonce_body, RIGHTARG = sendonce_body, FUNCTION = public.sendonce_body_eq)`,
	`CREATE FUNCTION public.sendonce_e164_eq(sendonce_e164, sendonce_e164) RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN PERFORM public.sendonce_take(); RETURN true; END $$`,
	`CREATE OPERATOR public.= (LEFTARG = sendonce_e164, RIGHTARG = sendonce_e164, FUNCTION = public.sendonce_e164_eq)`,
}

// In a schema where PUBLIC may create (a database upgraded from Postgres 14
// or earlier), an application's login plants functions and operators that
// match the calls of the database's own functions better than the
// built-in ones. The functions that run with the table owner's rights (the
// receiver's receipts, the console's replay, the relay's purge, the
// applications' status) and the triggers (run by whoever writes, the owner
// included) never call them: nothing is copied out, the forward-only
// trigger stays on, and the owner's change of a body is still refused.
// Migration 0023.
func TestPlantedFunctionsNeverRunForTheDatabasesOwnFunctions(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	exec(t, owner, `GRANT CREATE ON SCHEMA public TO PUBLIC`)
	sent := enqueue(t, owner, "+15551234567", "Your code is 482901")
	exec(t, owner, `UPDATE sms_outbox SET status = 'sent', provider_ref = 'msg_s', attempt_count = 1, sent_at = now() WHERE id = $1`, sent)
	dead := enqueue(t, owner, "+15557654321", "Your code is 111111")
	exec(t, owner, `UPDATE sms_outbox SET status = 'dead', end_reason = 'permanent', attempt_count = 1, letter_seq = 3 WHERE id = $1`, dead)
	delivered := enqueue(t, owner, "+15550001111", "Your code is 222222")
	exec(t, owner, `UPDATE sms_outbox SET status = 'delivered', provider_ref = 'msg_d', attempt_count = 1, sent_at = now() WHERE id = $1`, delivered)

	appPool := rolePool(t, url, "sendonce_app")
	for _, stmt := range planted {
		if _, err := appPool.Exec(ctx, stmt); err != nil {
			t.Fatalf("plant as sendonce_app: %v\n%s", err, stmt)
		}
	}

	receiver := rolePool(t, url, "sendonce_receiver")
	if err := pgx.BeginFunc(ctx, receiver, func(tx pgx.Tx) error {
		_, err := outbox.ApplyReceipts(ctx, tx, []outbox.Receipt{{ID: sent, Status: outbox.StatusDelivered, ProviderRef: "msg_s", Source: "generic"}})
		return err
	}); err != nil {
		t.Errorf("receipt as sendonce_receiver: %v", err)
	}
	console := rolePool(t, url, "sendonce_console")
	if err := pgx.BeginFunc(ctx, console, func(tx pgx.Tx) error {
		audit := outbox.ConsoleReplay{User: "alice", Role: "operator", Requested: []uuid.UUID{dead}}
		_, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: dead}}, outbox.ReplayOptions{Audit: &audit})
		return err
	}); err != nil {
		t.Errorf("replay as sendonce_console: %v", err)
	}
	if _, err := outbox.Purge(ctx, rolePool(t, url, "sendonce_relay"), time.Hour, 100); err != nil {
		t.Errorf("purge as sendonce_relay: %v", err)
	}
	if _, err := appPool.Exec(ctx, `SELECT * FROM sendonce_status($1)`, sent); err != nil {
		t.Errorf("status as sendonce_app: %v", err)
	}
	// The owner's own change of a body (an administrator's mistake) is
	// refused by the intent trigger, which runs as the owner.
	_, err := owner.Exec(ctx, `UPDATE sms_outbox SET body = 'changed' WHERE id = $1`, delivered)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Errorf("the owner changed a body: %v; want it refused (check_violation)", err)
	}

	rows, _ := owner.Query(ctx, `SELECT who, coalesce(what, '(nothing readable)') FROM public.sendonce_loot`)
	loot, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Who, What string }])
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range loot {
		t.Errorf("a planted function ran as %s and took %q", l.Who, l.What)
	}
	var enabled string
	if err := owner.QueryRow(ctx, `SELECT tgenabled::text FROM pg_trigger
		WHERE tgrelid = 'sms_outbox'::regclass AND tgname = 'sms_outbox_forward_only'`).Scan(&enabled); err != nil || enabled != "O" {
		t.Errorf("the forward-only trigger is %q (%v); want it enabled (O)", enabled, err)
	}
	if _, err := rolePool(t, url, "sendonce_relay").Exec(ctx, `UPDATE sms_outbox SET status = 'pending' WHERE id = $1`, delivered); err == nil {
		t.Error("the relay moved a delivered row back to pending")
	}
}
