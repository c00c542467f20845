package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/outbox"
)

// intent is one message of the demo's second act, and what must become of
// it.
type intent struct {
	what string
	id   uuid.UUID
	// want is the status it must end in; calls, the provider calls it may
	// cost (at most).
	want  outbox.State
	calls int
}

// intents shows what a user sees of intents, time and consent: a form
// posted twice sends one code, a reminder waits for its hour, a code that
// expired before it could be sent is never sent, a cancelled message is
// taken back, and a number that replied STOP is never messaged. It prints one line, and fails if any ends otherwise or costs a call
// it must not.
func (d *demo) intents(ctx context.Context, pool *pgxpool.Pool, stubURL, receiverURL string) error {
	start := time.Now()
	to := func() string { return fmt.Sprintf("+1555%07d", rand.IntN(10_000_000)) }
	// A recipient replies STOP (to a message of the first act, say): the
	// provider forwards the reply, signed, to the receiver, which puts the
	// number on the suppression list before it answers.
	stopped := to()
	status, err := smsstub.PostInbound(ctx, stubURL, smsstub.Inbound{
		URL: receiverURL + "/v1/inbound/generic", Shape: "generic", From: stopped, To: "+15550000000", Text: "STOP"})
	if err != nil || status/100 != 2 {
		return fmt.Errorf("intents: a STOP through the receiver: %d, %v", status, err)
	}
	var (
		list       []*intent
		twice      [2]uuid.UUID
		created    [2]bool
		reminderID uuid.UUID
	)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The same sign-up form posted twice.
		key, number := "demo-signup:"+uuid.NewString(), to()
		for i := range twice {
			var err error
			twice[i], err = outbox.Enqueue(ctx, tx, number, "Your sendonce demo code is 271828",
				outbox.WithKey(key), outbox.Created(&created[i]), outbox.WithPriority(outbox.Urgent))
			if err != nil {
				return err
			}
		}
		list = append(list, &intent{what: "form posted twice, one key", id: twice[0], want: outbox.StatusSent, calls: 1})
		// A reminder two seconds from now.
		id, err := outbox.Enqueue(ctx, tx, to(), "Reminder: your sendonce demo table is booked", outbox.WithSendAt(time.Now().Add(2*time.Second)))
		if err != nil {
			return err
		}
		reminderID = id
		list = append(list, &intent{what: "reminder for in 2s", id: id, want: outbox.StatusSent, calls: 1})
		// A code written during an outage: worth sending for a moment only.
		id, err = outbox.Enqueue(ctx, tx, to(), "Your sendonce demo code is 314159",
			outbox.WithExpiresAt(time.Now().Add(time.Millisecond)))
		if err != nil {
			return err
		}
		list = append(list, &intent{what: "code that expired before it could go", id: id, want: outbox.StatusExpired})
		// A booking confirmation for tomorrow, then the booking is cancelled.
		id, err = outbox.Enqueue(ctx, tx, to(), "Your sendonce demo booking is confirmed", outbox.WithSendAt(time.Now().Add(24*time.Hour)))
		if err != nil {
			return err
		}
		list = append(list, &intent{what: "booking for tomorrow, cancelled", id: id, want: outbox.StatusCancelled})
		// A message to the number that replied STOP.
		id, err = outbox.Enqueue(ctx, tx, stopped, "Your sendonce demo newsletter")
		if err != nil {
			return err
		}
		list = append(list, &intent{what: "to a number that replied STOP", id: id, want: outbox.StatusSuppressed})
		return nil
	})
	if err != nil {
		return fmt.Errorf("intents: %w", err)
	}
	if twice[0] != twice[1] || !created[0] || created[1] {
		return fmt.Errorf("intents: the form posted twice wrote %v (ids %s, %s)", created, twice[0], twice[1])
	}
	if st, err := outbox.Cancel(ctx, pool, list[3].id); err != nil || st != outbox.StatusCancelled {
		return fmt.Errorf("intents: cancel: %s, %v", st, err)
	}
	deadline := time.Now().Add(d.cfg.timeout)
	for {
		done := true
		for _, in := range list {
			st, err := outbox.Status(ctx, pool, in.id)
			if err != nil {
				return fmt.Errorf("intents: %w", err)
			}
			done = done && st.Status.Terminal()
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("intents: not finished within %s", d.cfg.timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	deliveries, err := smsstub.FetchDeliveries(ctx, stubURL)
	if err != nil {
		return err
	}
	var parts, bad []string
	for _, in := range list {
		st, err := outbox.Status(ctx, pool, in.id)
		if err != nil {
			return fmt.Errorf("intents: %w", err)
		}
		calls := deliveries[in.id.String()].Deliveries
		got := st.Status
		if got == outbox.StatusDelivered || got == outbox.StatusUndelivered {
			got = outbox.StatusSent // a receipt came: sent, and more
		}
		note := fmt.Sprintf("%s: %s, %d sent", in.what, st.Status, calls)
		if in.id == reminderID {
			var late float64
			if err := pool.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM sent_at - send_at), 0) FROM sms_outbox WHERE id = $1`, in.id).Scan(&late); err != nil {
				return fmt.Errorf("intents: %w", err)
			}
			note = fmt.Sprintf("%s (%s after its send time)", note, secs(late))
		}
		parts = append(parts, note)
		if got != in.want || calls > in.calls {
			bad = append(bad, fmt.Sprintf("%s ended %s with %d deliveries", in.what, st.Status, calls))
		}
	}
	fmt.Fprintf(d.out, "intents:  %s (%s)\n", strings.Join(parts, "; "), time.Since(start).Round(time.Millisecond))
	if len(bad) > 0 {
		return fmt.Errorf("intents: %s", strings.Join(bad, "; "))
	}
	return nil
}
