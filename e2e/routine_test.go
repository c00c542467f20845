package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/outbox"
)

// A rolling restart under SMS_PROVIDERS without lookups: a sender held to
// 2 requests a second is stopped gracefully while it holds most of the
// backlog fetched and unclaimed. It hands those messages back; their next
// delivery, at the sender that replaces it, is not a lost attempt: every
// row is sent, once, at one provider, and none ends unknown without a call.
func TestARollingRestartLeavesNothingUnknown(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	secondary, secondaryURL := e.startStub()
	_, stopRelay := e.startRelay(relay.Config{})
	defer stopRelay()
	routes := func() []sender.Route {
		return []sender.Route{e.route("primary", e.stubURL, 2*time.Second), e.route("secondary", secondaryURL, 2*time.Second)}
	}
	slow := 2.0
	stop := e.startSender(senderOptions{flow: &slow, cfg: sender.Config{Routes: routes()}})
	ids := e.insert(30)
	// Wait until the sender holds messages it has not claimed, then stop it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		open, attempted := e.progress(ids)
		if attempted >= 3 && open >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slow sender never held a backlog: %d open, %d attempted", open, attempted)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	open, _ := e.progress(ids)
	t.Logf("stopped the first sender with %d of %d rows open", open, len(ids))

	// Its replacement, after a rolling restart.
	stop = e.startSender(senderOptions{cfg: sender.Config{Routes: routes()}})
	defer stop()
	rows := e.waitTerminal(ids, 60*time.Second)
	a, b := e.stub.Deliveries(), secondary.Deliveries()
	for _, id := range ids {
		k := id.String()
		n := a[k].Deliveries + b[k].Deliveries
		if rows[id].status != outbox.StatusSent || n != 1 {
			t.Errorf("row %s: %s (%s), deliveries primary %d, secondary %d; want sent once",
				id, rows[id].status, rows[id].lastErr, a[k].Deliveries, b[k].Deliveries)
		}
	}
}

// progress counts the rows of ids not yet finished, and those attempted.
func (e *env) progress(ids []uuid.UUID) (open, attempted int) {
	e.t.Helper()
	var o, a int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status NOT IN ('sent', 'delivered', 'undelivered', 'dead', 'unknown')),
		count(*) FILTER (WHERE attempt_count > 0) FROM sms_outbox WHERE id = ANY($1)`, ids).Scan(&o, &a); err != nil {
		e.t.Fatal(err)
	}
	return o, a
}
