package deadletter

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/directget"
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
		SafeUnknown: l.Idempotency == ProviderIdempotent, Elsewhere: l.Elsewhere,
	}
}

// BySequence reads the letters of stream (default "SMS_DLQ") stored at
// seqs, in stream order; a sequence the stream no longer holds is left out.
// It reads from the lowest sequence to the highest with direct gets (no
// consumer), so it suits sequences close together (the letters of one
// incident).
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
	var out []Letter
	req := directget.Request{Seq: first}
	if subs := info.Config.Subjects; len(subs) == 1 {
		req.NextFor = subs[0]
	}
	seen := first - 1
	for seen < last {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		req.Batch, req.UpToSeq = int(min(256, last-seen)), last
		batch, err := directget.Get(ctx, js.Conn(), stream, req)
		if errors.Is(err, directget.ErrNoMessages) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read dead letters: %w", err)
		}
		for _, m := range batch {
			l, err := parseStored(m)
			if err != nil {
				return nil, err
			}
			seen = l.Seq
			if want[l.Seq] {
				out = append(out, l)
			}
		}
		if len(batch) == 0 {
			break
		}
		req.Seq = seen + 1
	}
	return out, nil
}
