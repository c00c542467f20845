package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

// crashedAfterAccept inserts one row that a sender was calling when it
// died: the provider delivered it, its lease expired, its message is back on
// the stream; with spent, that was the row's last attempt.
func (e *env) crashedAfterAccept(t *testing.T, lease time.Duration, spent bool) []uuid.UUID {
	t.Helper()
	ids := e.insert(1)
	if err := e.deliverDirectly(ids[0]); err != nil {
		t.Fatal(err)
	}
	e.crashedMidCall(t, ids[0], lease)
	if spent {
		if _, err := e.pool.Exec(context.Background(), `UPDATE sms_outbox SET attempt_count = max_attempts WHERE id = $1`, ids[0]); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// crashedMidCall leaves id as a sender that died between the provider's
// accept and its status write would: the provider delivered it, the row is
// sending with an expired lease, and its message is back on the stream.
func (e *env) crashedMidCall(t *testing.T, id uuid.UUID, lease time.Duration) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sending', attempt_count = 1,
		updated_at = now() - $2::interval WHERE id = $1`, id, 2*lease); err != nil {
		t.Fatal(err)
	}
	data := wire.AppendEncode(nil, wire.Send{ID: id})
	if _, err := e.js.Publish(ctx, streams.SubjectSend, data, jetstream.WithMsgID(id.String())); err != nil {
		t.Fatal(err)
	}
}

// An idempotent provider: the attempt after the crash carries the same key,
// the provider replays its answer, the row ends sent with one delivery.
func TestSenderDiedAfterAcceptIdempotentProviderReplays(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	lease := 2 * time.Second
	ids := e.crashedAfterAccept(t, lease, false)
	e.startSender(senderOptions{timeout: 1500 * time.Millisecond, cfg: sender.Config{Lease: lease}})
	rows := e.waitTerminal(ids, 30*time.Second)
	r := rows[ids[0]]
	if r.status != outbox.StatusSent || r.attempts != 2 {
		t.Fatalf("row = %+v, want sent on attempt 2", r)
	}
	d := e.stub.Deliveries()[ids[0].String()]
	if d.Deliveries != 1 || d.Requests != 2 {
		t.Fatalf("provider: %+v, want 1 delivery from 2 requests", d)
	}
	e.checkOnce(ids, rows)
}

// A provider without idempotency: the outcome of the dead attempt is
// unknowable and a new call could send twice, so the row ends unknown with an
// ambiguous dead letter and the provider is not called again; also when the
// sender died on the row's last attempt (not dead: "dead" would invite a
// replay of a message that may have been delivered).
func TestSenderDiedAfterAcceptNonIdempotentProviderEndsUnknown(t *testing.T) {
	t.Parallel()
	for _, spent := range []bool{false, true} {
		t.Run(fmt.Sprintf("last attempt %v", spent), func(t *testing.T) {
			t.Parallel()
			e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true}})
			lease := 2 * time.Second
			ids := e.crashedAfterAccept(t, lease, spent)
			no := false
			e.startSender(senderOptions{timeout: 1500 * time.Millisecond, idempotent: &no, cfg: sender.Config{Lease: lease}})
			rows := e.waitTerminal(ids, 30*time.Second)
			if r := rows[ids[0]]; r.status != outbox.StatusUnknown {
				t.Fatalf("row = %+v, want unknown", r)
			}
			if d := e.stub.Deliveries()[ids[0].String()]; d.Requests != 1 || d.Deliveries != 1 {
				t.Fatalf("provider: %+v, want the one original request only", d)
			}
			dl := deadLetterFor(e.lettersOf(ids[:1], 30*time.Second), ids[0])
			if len(dl) != 1 || dl[0].Header.Get(wire.HeaderReason) != wire.ReasonAmbiguous {
				t.Fatalf("dead letters = %v, want one with reason ambiguous", dl)
			}
		})
	}
}

// A delivery that finds the row leased by a live attempt (AckWait expired
// while another sender is still calling) backs off without calling, and the
// row gets one final status.
func TestConcurrentDeliveryBacksOff(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	ids := e.insert(1)
	ctx := context.Background()
	// Another sender holds a fresh lease.
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sending', attempt_count = 1, updated_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	data := wire.AppendEncode(nil, wire.Send{ID: ids[0]})
	if _, err := e.js.Publish(ctx, streams.SubjectSend, data, jetstream.WithMsgID(ids[0].String())); err != nil {
		t.Fatal(err)
	}
	// The other attempt is alive: it keeps its lease fresh until it ends.
	alive, stopAlive := context.WithCancel(ctx)
	var touching sync.WaitGroup
	touching.Add(1)
	go func() {
		defer touching.Done()
		for alive.Err() == nil {
			_, _ = e.pool.Exec(alive, `UPDATE sms_outbox SET updated_at = now() WHERE id = $1 AND status = 'sending'`, ids[0])
			time.Sleep(100 * time.Millisecond)
		}
	}()
	lease := 3 * time.Second
	reg := prometheus.NewRegistry()
	e.startSender(senderOptions{timeout: 1500 * time.Millisecond, cfg: sender.Config{Lease: lease, Registerer: reg}})
	// While the lease lives the provider is never called.
	testkit.WaitFor(t, 30*time.Second, "the delivery to back off", func() bool {
		return counterValue(t, reg, "sendonce_sender_lease_backoffs_total") >= 1
	})
	if n := e.stub.Stats().Requests; n != 0 {
		t.Fatalf("provider called %d times during another attempt's lease", n)
	}
	// The other attempt finishes: the row is sent and the backed-off
	// delivery is acked without a call when it comes back.
	stopAlive()
	touching.Wait()
	if _, err := e.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sent', provider_ref = 'msg_other' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the backed-off delivery to be acked", func() bool {
		c, err := e.js.Consumer(ctx, streams.Stream, streams.Consumer)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	if n := e.stub.Stats().Requests; n != 0 {
		t.Fatalf("provider called %d times for a row another attempt finished", n)
	}
}

// deliverDirectly makes the provider accept the row's message as the first
// (crashed) attempt did.
func (e *env) deliverDirectly(id uuid.UUID) error {
	var to, body string
	if err := e.pool.QueryRow(context.Background(), `SELECT to_e164, body FROM sms_outbox WHERE id = $1`, id).Scan(&to, &body); err != nil {
		return err
	}
	c, err := newProviderClient(e.stubURL, true)
	if err != nil {
		return err
	}
	out := c.Send(context.Background(), providerMessage(id, to, body))
	if out.Ref == "" {
		return fmt.Errorf("direct delivery: %s", out.Error())
	}
	return nil
}

// The same at an idempotent provider: one more call under the same key
// learns the dead attempt's outcome (a replay), and the row ends sent.
func TestDiedOnTheLastAttemptIdempotentLearnsTheOutcome(t *testing.T) {
	t.Parallel()
	e := setup(t, envOptions{})
	lease := 2 * time.Second
	ids := e.crashedAfterAccept(t, lease, true)
	e.startSender(senderOptions{timeout: 1500 * time.Millisecond, cfg: sender.Config{Lease: lease}})
	rows := e.waitTerminal(ids, 30*time.Second)
	if r := rows[ids[0]]; r.status != outbox.StatusSent {
		t.Fatalf("row = %+v, want sent", r)
	}
	e.checkOnce(ids, rows)
}
