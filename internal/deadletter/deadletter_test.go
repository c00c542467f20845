package deadletter_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/natstest"
	"github.com/sendonce/sendonce/internal/wire"
)

// Dead-lettering the same publication twice (a crash between the letter and
// the status write) stores one letter; a new generation (a replayed row that
// dies again) stores another. List reads them back with every header.
func TestPublishIsDeduplicatedPerGeneration(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := deadletter.Publisher{JetStream: js}
	id := uuid.New()
	l := deadletter.Letter{
		OutboxID: id, Reason: wire.ReasonPermanent, Error: "http 400: invalid To", Attempts: 1, ProviderCode: 21211,
		Payload: wire.AppendEncode(nil, wire.Send{ID: id}),
	}
	for range 3 {
		if _, err := p.Publish(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	l.Gen = 1
	if _, err := p.Publish(ctx, l); err != nil {
		t.Fatal(err)
	}
	other := deadletter.Letter{Reason: wire.ReasonInvalid, Error: "not json", Payload: []byte("x"), StreamSeq: 7}
	if _, err := p.Publish(ctx, other); err != nil {
		t.Fatal(err)
	}
	all, err := deadletter.List(ctx, js, "", deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Fatalf("%d letters stored, want 3 (one per generation, one invalid)", len(all))
	}
	mine, err := deadletter.List(ctx, js, "", deadletter.Filter{OutboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) != 2 || mine[0].Gen != 0 || mine[1].Gen != 1 {
		t.Fatalf("letters of the row = %+v", mine)
	}
	got := mine[0]
	if got.Reason != wire.ReasonPermanent || got.ProviderCode != 21211 || got.Attempts != 1 || got.Error != l.Error || got.Seq == 0 || got.Time.IsZero() {
		t.Fatalf("letter read back = %+v", got)
	}
	if p, err := wire.Decode(got.Payload); err != nil || p.ID != id {
		t.Fatalf("payload = %q, %v", got.Payload, err)
	}
	invalid, err := deadletter.List(ctx, js, "", deadletter.Filter{Reason: wire.ReasonInvalid})
	if err != nil || len(invalid) != 1 || invalid[0].OutboxID != uuid.Nil {
		t.Fatalf("invalid letters = %+v, %v", invalid, err)
	}
}
