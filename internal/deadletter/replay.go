package deadletter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/streams"
)

// ReplayTarget is what a replay from this letter asks of outbox.Replay: put
// its row back to pending only while the row is still in the state the
// letter describes (its generation and reason), and, if the row is unknown,
// without force only when the letter records a provider that honours
// idempotency keys. relay dlq replay and the console build their targets
// here.
func (l Letter) ReplayTarget() outbox.ReplayTarget {
	return outbox.ReplayTarget{
		ID: l.OutboxID, FromLetter: true, Gen: l.Gen, Reason: l.Reason,
		SafeUnknown: l.Idempotency == ProviderIdempotent,
	}
}

// BySequence reads the letters of stream (default "SMS_DLQ") stored at
// seqs, in stream order; a sequence the stream no longer holds is left out.
// It reads from the lowest sequence to the highest with an ordered consumer,
// so it suits sequences close together (the letters of one incident).
func BySequence(ctx context.Context, js jetstream.JetStream, stream string, seqs []uint64) ([]Letter, error) {
	if len(seqs) == 0 {
		return nil, nil
	}
	if stream == "" {
		stream = streams.DeadLetterStream
	}
	want := map[uint64]bool{}
	for _, s := range seqs {
		want[s] = true
	}
	first, last := slices.Min(seqs), slices.Max(seqs)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	last = min(last, info.State.LastSeq)
	first = max(first, info.State.FirstSeq)
	if info.State.Msgs == 0 || first > last {
		return nil, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first,
	})
	if err != nil {
		return nil, fmt.Errorf("read dead letters: %w", err)
	}
	var out []Letter
	seen := first - 1
	for seen < last {
		batch, err := cons.Fetch(int(min(256, last-seen)), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("read dead letters: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			l, err := Parse(m)
			if err != nil {
				return nil, err
			}
			seen = l.Seq
			if want[l.Seq] {
				out = append(out, l)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("read dead letters: %w", err)
		}
		if n == 0 {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}
