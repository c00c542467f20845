package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// A relay's login tries to purge, in one call of sendonce_purge, rows that
// retention keeps: a pending row it moves to queued and dead itself, an
// unknown row an attempt may have reached (it clears maybe_accepted and
// moves it to dead), and a row delivered minutes ago; it backdates each
// row's updated_at, records a dead letter that does not exist, and tries
// the attempt count and the finish time as well. Retention rests on facts
// the relay cannot write: the time the row finished (finished_at, set by
// the database on each move into sent, delivered, undelivered or dead,
// and granted to no component) and attempts spent (the relay may no longer
// set attempt_count, and ends only a row whose attempts are spent). None
// of the three is purged; a row that finished two days ago is. Migration
// 0026.
func TestTheRelayCannotPurgeWhatRetentionKeeps(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	relay := rolePool(t, url, "sendonce_relay")
	attack := func(id uuid.UUID, stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			if _, err := relay.Exec(ctx, s, id); err != nil {
				t.Logf("the relay's %q: %v", s, err)
			}
		}
	}
	pending := enqueue(t, owner, "+15551234567", "Your code is 482901")
	attack(pending,
		`UPDATE sms_outbox SET attempt_count = max_attempts WHERE id = $1`,
		`UPDATE sms_outbox SET status = 'queued' WHERE id = $1`,
		`UPDATE sms_outbox SET status = 'dead', end_reason = 'max_attempts' WHERE id = $1`)

	doubtful := enqueue(t, owner, "+15551234568", "Your code is 482902")
	exec(t, owner, `UPDATE sms_outbox SET status = 'unknown', end_reason = 'ambiguous', attempt_count = 1, maybe_accepted = true,
		letter_seq = 3 WHERE id = $1`, doubtful)
	attack(doubtful,
		`UPDATE sms_outbox SET maybe_accepted = false WHERE id = $1`,
		`UPDATE sms_outbox SET status = 'dead', end_reason = 'permanent' WHERE id = $1`)

	delivered := enqueue(t, owner, "+15551234569", "Your code is 482903")
	exec(t, owner, `UPDATE sms_outbox SET status = 'sending', attempt_count = 1 WHERE id = $1`, delivered)
	exec(t, owner, `UPDATE sms_outbox SET status = 'delivered', provider_ref = 'msg_d', sent_at = now() WHERE id = $1`, delivered)

	for _, id := range []uuid.UUID{pending, doubtful, delivered} {
		attack(id,
			`UPDATE sms_outbox SET letter_seq = 99, updated_at = now() - interval '2 days' WHERE id = $1`,
			`UPDATE sms_outbox SET finished_at = now() - interval '2 days' WHERE id = $1`)
	}

	old := enqueue(t, owner, "+15551234570", "Your code is 482904")
	exec(t, owner, `UPDATE sms_outbox SET status = 'sending', attempt_count = 1 WHERE id = $1`, old)
	exec(t, owner, `UPDATE sms_outbox SET status = 'delivered', provider_ref = 'msg_o', sent_at = now() WHERE id = $1`, old)
	backdate(t, owner, old, 48*time.Hour)

	n, err := outbox.Purge(ctx, relay, time.Hour, 100)
	if err != nil {
		t.Fatalf("purge as sendonce_relay: %v", err)
	}
	if n != 1 {
		t.Errorf("the relay's purge deleted %d rows, want 1 (the row finished two days ago)", n)
	}
	for name, id := range map[string]uuid.UUID{"the pending row": pending, "the unknown row": doubtful, "the row delivered now": delivered} {
		var status string
		if err := owner.QueryRow(ctx, `SELECT status FROM sms_outbox WHERE id = $1`, id).Scan(&status); err != nil {
			t.Errorf("%s was purged (%v)", name, err)
			continue
		}
		t.Logf("%s: %s", name, status)
	}
	var status string
	if err := owner.QueryRow(ctx, `SELECT status FROM sms_outbox WHERE id = $1`, pending).Scan(&status); err == nil && status == "dead" {
		t.Error("the relay made a row no sender ever claimed dead")
	}
}

// backdate makes row id look finished, and last changed, age ago, as the
// table's owner (finished_at is no component's to write).
func backdate(t *testing.T, owner *pgxpool.Pool, id uuid.UUID, age time.Duration) {
	t.Helper()
	exec(t, owner, `UPDATE sms_outbox SET finished_at = now() - $2::interval, updated_at = now() - $2::interval WHERE id = $1`, id, age)
}

// Rows that finished before migration 0026 have no finish time: their last
// change stands for it, once the migration is older than the hour the
// purge keeps every row (a row it finds finished finished before the
// migration, so an hour ago at least).
func TestRowsFinishedBeforeTheMigrationArePurgedByTheirLastChange(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	relay := rolePool(t, url, "sendonce_relay")
	id := enqueue(t, owner, "+15551234567", "Your code is 482901")
	exec(t, owner, `UPDATE sms_outbox SET status = 'sent', attempt_count = 1, provider_ref = 'msg_1', sent_at = now() WHERE id = $1`, id)
	exec(t, owner, `UPDATE sms_outbox SET finished_at = NULL, updated_at = now() - interval '2 days' WHERE id = $1`, id)
	if n, err := outbox.Purge(ctx, relay, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("purge just after the migration: %d, %v; want 0 (the row may have finished a second ago)", n, err)
	}
	exec(t, owner, `UPDATE sendonce_schema_migrations SET applied_at = now() - interval '61 minutes' WHERE version = 26`)
	if n, err := outbox.Purge(ctx, relay, time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("purge an hour after the migration: %d, %v; want 1", n, err)
	}
}
