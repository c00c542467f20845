package outbox_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// An INSERT that breaks a rule of sms_outbox, written as plain SQL with
// its values in the text (as an application in another language might),
// is refused with an error that names the rule and carries neither the
// number nor the body: not in its message, detail, hint or context, which
// go to the client and to the server's log. Postgres puts the whole row in
// the detail of a table's CHECK or NOT NULL ("Failing row contains
// (...)"); a domain's check, and a trigger's own error, carry no value.
// Every CHECK and NOT NULL of the table, read from the catalog, has a case
// here, as the table's owner (who may write every column), and the
// application's role breaks the rules of the columns it may write.
// Migration 0028.
func TestRefusedInsertsCarryNoNumberOrBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const number, body = "+15557654321", "Your secret code is 918273"
	type kase struct {
		rule string // the constraint, or the column whose NOT NULL it is
		cols string // the columns written besides id, to_e164, body
		vals string
		id   string // the id (default: a fresh one), number and body
		to   string
		body string
	}
	fresh := func() string { return "'" + uuid.NewString() + "'" }
	lit := func(s string) string { return "'" + s + "'" }
	cases := []kase{
		{rule: "sms_outbox_status_valid", cols: ", status", vals: ", 'done'"},
		{rule: "sms_outbox_attempt_count_check", cols: ", attempt_count", vals: ", -1"},
		{rule: "sms_outbox_max_attempts_check", cols: ", max_attempts", vals: ", 0"},
		{rule: "sms_outbox_publish_gen_check", cols: ", publish_gen", vals: ", -1"},
		{rule: "sms_outbox_end_reason_valid", cols: ", end_reason", vals: ", 'bored'"},
		{rule: "sms_outbox_priority_valid", cols: ", priority", vals: ", 7"},
		{rule: "sms_outbox_dead_never_maybe_accepted", cols: ", status, maybe_accepted, end_reason", vals: ", 'dead', true, 'permanent'"},
		{rule: "sms_outbox_to_e164_format", to: "'+1555abc'"},
		{rule: "sms_outbox_body_length", body: "''"},
		{rule: "id", id: "NULL"},
		{rule: "to_e164", to: "NULL"},
		{rule: "body", body: "NULL"},
	}
	for _, col := range []string{"status", "attempt_count", "max_attempts", "publish_gen", "next_attempt_at", "created_at",
		"updated_at", "maybe_accepted", "priority", "lookup_pending", "lookups", "lookup_everywhere"} {
		cases = append(cases, kase{rule: col, cols: ", " + col, vals: ", NULL"})
	}
	dup := uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, $3)`, dup, number, body); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, kase{rule: "sms_outbox_pkey", id: lit(dup)})

	// Every rule of the table has its case.
	rows, _ := db.Query(ctx, `SELECT conname::text FROM pg_constraint WHERE conrelid = 'sms_outbox'::regclass AND contype IN ('c', 'p', 'u')
		UNION ALL SELECT attname::text FROM pg_attribute WHERE attrelid = 'sms_outbox'::regclass AND attnotnull AND attnum > 0 AND NOT attisdropped
		UNION ALL SELECT c.conname::text FROM pg_constraint c JOIN pg_type ty ON ty.oid = c.contypid WHERE ty.typname IN ('sendonce_e164', 'sendonce_body')`)
	rules, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.rule] = true
	}
	for _, r := range rules {
		if !covered[r] && !strings.HasSuffix(r, "_required") {
			t.Errorf("sms_outbox has the rule %s and this test no case that breaks it: add one", r)
		}
	}

	check := func(who string, pool *pgxpool.Pool, c kase) {
		t.Helper()
		id, to, b := c.id, c.to, c.body
		if id == "" {
			id = fresh()
		}
		if to == "" {
			to = lit(number)
		}
		if b == "" {
			b = lit(body)
		}
		sql := `INSERT INTO sms_outbox (id, to_e164, body` + c.cols + `) VALUES (` + id + `, ` + to + `, ` + b + c.vals + `)`
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Errorf("%s, %s: %v; want it refused", who, c.rule, err)
			return
		}
		for field, v := range map[string]string{"message": pgErr.Message, "detail": pgErr.Detail, "hint": pgErr.Hint,
			"where": pgErr.Where, "internal query": pgErr.InternalQuery} {
			if strings.Contains(v, "5557654321") || strings.Contains(v, "918273") {
				t.Errorf("%s, %s: the error's %s carries the number or the body: %q", who, c.rule, field, v)
			}
		}
		if pgErr.ConstraintName != c.rule && pgErr.ColumnName != c.rule && !strings.Contains(pgErr.Message, c.rule) {
			t.Errorf("%s, %s: the error names no rule: %s (constraint %q, column %q)", who, c.rule, pgErr.Message, pgErr.ConstraintName, pgErr.ColumnName)
		}
	}
	for _, c := range cases {
		check("the owner", db, c)
	}
	app, err := pgxpool.New(ctx, pgtest.AsRole(t, os.Getenv("DATABASE_URL"), "sendonce_app"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	// The columns the application may write (migrations 0004, 0007).
	for _, c := range cases {
		switch c.rule {
		case "id", "to_e164", "body", "priority", "sms_outbox_priority_valid", "sms_outbox_to_e164_format",
			"sms_outbox_body_length", "sms_outbox_pkey":
			check("the application", app, c)
		}
	}
}
