package e2e

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// auditStatuses records every status change of the outbox in a test-only
// table, so a test can check I3 (forward only) after the fact.
func (e *env) auditStatuses() {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), `
CREATE TABLE test_status_log (id uuid, old text, new text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION test_log_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO test_status_log (id, old, new) VALUES (NEW.id, OLD.status, NEW.status);
	RETURN NULL;
END $$;
CREATE TRIGGER test_log_status AFTER UPDATE OF status ON sms_outbox
	FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION test_log_status();`)
	if err != nil {
		e.t.Fatal(err)
	}
}

// allowed are the status changes the protocol makes; a terminal status never
// changes (operator replays are not part of these tests).
var allowed = map[string]bool{
	"pending>queued": true, "pending>sending": true, "pending>sent": true, "pending>dead": true, "pending>unknown": true,
	"queued>sending": true, "queued>sent": true, "queued>dead": true, "queued>unknown": true,
	"sending>queued": true, "sending>sent": true, "sending>dead": true, "sending>unknown": true,
}

// checkForwardOnly asserts I3 over the audit log.
func (e *env) checkForwardOnly() {
	e.t.Helper()
	rows, _ := e.pool.Query(context.Background(), `SELECT id, old, new FROM test_status_log ORDER BY at`)
	var id uuid.UUID
	var from, to string
	bad := 0
	_, err := pgx.ForEachRow(rows, []any{&id, &from, &to}, func() error {
		if !allowed[from+">"+to] {
			bad++
			if bad <= 5 {
				e.t.Errorf("row %s moved %s -> %s", id, from, to)
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if bad > 0 {
		e.t.Errorf("%d backward status changes (I3)", bad)
	}
}

// checkInvariants waits for I2 (every row terminal), then asserts I1 (once)
// and I3 (forward only) on ids.
func (e *env) checkInvariants(ids []uuid.UUID, d time.Duration) map[uuid.UUID]row {
	e.t.Helper()
	rows := e.waitTerminal(ids, d)
	e.checkOnce(ids, rows)
	e.checkForwardOnly()
	counts := map[string]int{}
	for _, id := range ids {
		counts[string(rows[id].status)]++
	}
	e.t.Logf("invariants hold over %d rows: %v", len(ids), fmt.Sprint(counts))
	return rows
}
