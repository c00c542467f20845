package deadletter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/wire"
)

// BySequence reads exactly the letters asked for, whatever their order, and
// leaves out sequences the stream does not hold.
func TestBySequence(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := deadletter.Publisher{JetStream: js}
	var seqs []uint64
	ids := map[uint64]uuid.UUID{}
	for i := range 600 {
		id := uuid.New()
		seq, err := p.Publish(ctx, deadletter.Letter{OutboxID: id, Gen: int32(i % 3), Reason: wire.ReasonPermanent, Payload: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
		ids[seq] = id
	}
	for _, tt := range []struct {
		name string
		ask  []uint64
		want []uint64
	}{
		{"none", nil, nil},
		{"one", []uint64{seqs[5]}, []uint64{seqs[5]}},
		{"far apart, out of order", []uint64{seqs[599], seqs[0], seqs[300]}, []uint64{seqs[0], seqs[300], seqs[599]}},
		{"beyond the stream", []uint64{seqs[10], seqs[599] + 50}, []uint64{seqs[10]}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := deadletter.BySequence(ctx, js, "", tt.ask)
			if err != nil {
				t.Fatal(err)
			}
			var gotSeqs []uint64
			for _, l := range got {
				gotSeqs = append(gotSeqs, l.Seq)
				if l.OutboxID != ids[l.Seq] {
					t.Errorf("letter %d names %s, want %s", l.Seq, l.OutboxID, ids[l.Seq])
				}
			}
			if fmt.Sprint(gotSeqs) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", gotSeqs, tt.want)
			}
		})
	}
}

func TestReplayTarget(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	for _, tt := range []struct {
		idem deadletter.Idempotency
		safe bool
	}{
		{deadletter.ProviderIdempotent, true},
		{deadletter.ProviderNotIdempotent, false},
		{deadletter.IdempotencyUnknown, false},
	} {
		got := deadletter.Letter{OutboxID: id, Gen: 2, Reason: wire.ReasonAmbiguous, Idempotency: tt.idem}.ReplayTarget()
		want := outbox.ReplayTarget{ID: id, FromLetter: true, Gen: 2, Reason: wire.ReasonAmbiguous, SafeUnknown: tt.safe}
		if got != want {
			t.Errorf("idempotency %d: %+v, want %+v", tt.idem, got, want)
		}
	}
}
