package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// A console login holds its transaction open after calling the console's
// replay functions on rows it may not replay (pending, queued, sending,
// sent): the relay still publishes them and the senders still claim them,
// at once. The functions lock only the rows a console replay may move
// (dead ones), and skip a dead row another transaction holds instead of
// waiting for it: Replay refuses that row as busy, and the console's
// second function leaves it. Migration 0024.
func TestTheConsoleLocksOnlyTheRowsItMayReplay(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	pending := consoleRow(t, owner, outbox.StatusPending, time.Minute)
	queued := consoleRow(t, owner, outbox.StatusQueued, time.Minute)
	exec(t, owner, `UPDATE sms_outbox SET next_attempt_at = now() - interval '1 minute' WHERE id = $1`, queued)
	sending := consoleRow(t, owner, outbox.StatusSending, time.Minute)
	sent := consoleRow(t, owner, outbox.StatusSent, time.Minute)
	dead := consoleRow(t, owner, outbox.StatusDead, time.Minute)
	busy := consoleRow(t, owner, outbox.StatusDead, time.Minute)
	named := []uuid.UUID{pending, queued, sending, sent, dead}

	console := rolePool(t, url, "sendonce_console")
	relay := rolePool(t, url, "sendonce_relay")
	sender := rolePool(t, url, "sendonce_sender")
	bounded := func(ctx context.Context, tx pgx.Tx) {
		t.Helper()
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
			t.Fatal(err)
		}
	}

	// Another transaction holds a dead row (a receipt being written).
	holder, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM sms_outbox WHERE id = $1 FOR NO KEY UPDATE`, busy); err != nil {
		t.Fatal(err)
	}

	for _, step := range []struct {
		name string
		sql  string
		args []any
	}{
		{"sendonce_replay_rows", `SELECT * FROM sendonce_replay_rows($1)`, []any{named}},
		{"sendonce_console_replay", `SELECT * FROM sendonce_console_replay('mallory', 'operator', $1, $1, '')`, []any{named}},
		{"sendonce_replay_rows, a held row", `SELECT * FROM sendonce_replay_rows($1)`, []any{[]uuid.UUID{pending, queued, busy}}},
		{"sendonce_console_replay, a held row", `SELECT * FROM sendonce_console_replay('mallory', 'operator', $1, $1, '')`,
			[]any{[]uuid.UUID{pending, queued, busy}}},
	} {
		t.Run(step.name, func(t *testing.T) {
			tx, err := console.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			bounded(ctx, tx)
			start := time.Now()
			if _, err := tx.Exec(ctx, step.sql, step.args...); err != nil {
				t.Fatalf("%s as sendonce_console: %v", step.name, err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("%s waited %s for a row another transaction holds", step.name, d)
			}
			// The console's transaction stays open. The relay publishes
			// the pending row, and a sender claims the queued one (each
			// rolled back, for the next step).
			within := func(pool interface {
				Begin(context.Context) (pgx.Tx, error)
			}, fn func(pgx.Tx) error) error {
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				tx, err := pool.Begin(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback(ctx)
				bounded(ctx, tx)
				return fn(tx)
			}
			if err := within(relay, func(tx pgx.Tx) error {
				ps, err := outbox.ClaimPending(ctx, tx, 100)
				if err == nil && (len(ps) != 1 || ps[0].ID != pending) {
					t.Errorf("the relay claimed %d pending rows, want the one the console named", len(ps))
				}
				return err
			}); err != nil {
				t.Errorf("the relay's claim: %v", err)
			}
			if err := within(sender, func(tx pgx.Tx) error {
				cs, err := outbox.ClaimForSend(ctx, tx, []uuid.UUID{queued}, nil, time.Minute, uuid.New())
				if err == nil && (len(cs) != 1 || cs[0].Result != outbox.Claimed) {
					t.Errorf("the sender's claim of the queued row: %+v", cs)
				}
				return err
			}); err != nil {
				t.Errorf("the sender's claim: %v", err)
			}
		})
	}

	// Replay through the console: the held row is refused as busy, the
	// free dead row replayed, neither waited for.
	err = pgx.BeginFunc(ctx, console, func(tx pgx.Tx) error {
		bounded(ctx, tx)
		audit := outbox.ConsoleReplay{User: "alice", Role: "operator", Requested: []uuid.UUID{dead, busy}}
		rs, err := outbox.Replay(ctx, tx, []outbox.ReplayTarget{{ID: dead}, {ID: busy}}, outbox.ReplayOptions{Audit: &audit})
		if err != nil {
			return err
		}
		if len(rs) != 2 || !rs[0].Replayed || rs[1].Replayed || !strings.Contains(rs[1].Refused, "another transaction") {
			t.Errorf("replay of a free and a held dead row: %+v", rs)
		}
		if len(audit.Replayed) != 1 || audit.Replayed[0] != dead || audit.Refused != 1 {
			t.Errorf("audit: %+v", audit)
		}
		return nil
	})
	if err != nil {
		t.Errorf("console replay: %v", err)
	}
}
