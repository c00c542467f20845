package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/wire"
)

// SMS_DLQ is bounded, and a full one refuses a new letter (discard new)
// rather than drop the oldest: every stored letter stays, the refused one
// is an error to its publisher, and its row stays without a letter
// recorded, so the reconciler (which keeps such rows, and retention does
// not purge them) publishes it once there is room. A letter is never
// dropped in silence, old or new.
func TestAFullDeadLetterStreamRefusesNewLettersAndLosesNone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := topo.Stream(streams.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxBytes <= 0 {
		t.Errorf("nats/SMS_DLQ.stream.json: max_bytes %d, want a bound", cfg.MaxBytes)
	}
	// The shipped stream with its bound scaled down to a few letters
	// (some 430 bytes each), so that the test fills it.
	cfg.MaxBytes = 4 << 10
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	pub := deadletter.Publisher{JetStream: e.js, Timeout: 5 * time.Second}
	letter := func(id uuid.UUID) deadletter.Letter {
		return deadletter.Letter{OutboxID: id, Reason: wire.ReasonPermanent, Error: "http 400: invalid To", Attempts: 1,
			ProviderCode: 21211, Payload: wire.AppendEncode(nil, wire.Send{ID: id})}
	}
	var stored []uint64
	var refused error
	for range 100 {
		seq, err := pub.Publish(ctx, letter(uuid.New()))
		if err != nil {
			refused = err
			break
		}
		stored = append(stored, seq)
	}
	if refused == nil {
		t.Fatalf("SMS_DLQ took 100 letters within %d bytes: it drops old letters (discard %s) instead of refusing new ones", cfg.MaxBytes, cfg.Discard)
	}
	t.Logf("%d letters stored, then: %v", len(stored), refused)
	s, err := e.js.Stream(ctx, streams.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range stored {
		if _, err := s.GetMsg(ctx, seq); err != nil {
			t.Fatalf("stored letter %d is gone after the stream filled: %v", seq, err)
		}
	}

	// A row ended dead and its letter is due (a sender died, or the
	// stream refused it, before it was recorded).
	id := uuid.New()
	if _, err := e.pool.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, end_reason, attempt_count, last_error)
		VALUES ($1, '+15557654321', 'hello', 'dead', 'permanent', 1, 'http 400: invalid To')`, id); err != nil {
		t.Fatal(err)
	}
	r, err := relay.NewReconciler(relay.ReconcilerConfig{Pool: e.pool, JetStream: e.js, LetterGrace: time.Nanosecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	letterSeq := func() *int64 {
		t.Helper()
		var seq *int64
		if err := e.pool.QueryRow(ctx, `SELECT letter_seq FROM sms_outbox WHERE id = $1`, id).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return seq
	}
	if _, err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if seq := letterSeq(); seq != nil {
		t.Fatalf("the row's letter is recorded at %d while the full stream refuses letters", *seq)
	}

	// Room again (an operator raised the bound, or letters expired): the
	// next pass stores the row's letter and records it.
	cfg.MaxBytes = 1 << 20
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	seq := letterSeq()
	if seq == nil {
		t.Fatal("the row's letter is still not recorded with room in the stream")
	}
	m, err := s.GetMsg(ctx, uint64(*seq))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(wire.HeaderOutboxID); got != id.String() {
		t.Fatalf("letter %d is of row %q, want %s", *seq, got, id)
	}
}
