package sender

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// horizonRefresh is how often the work stream's memory is read again: a
// stream recreated after a store loss is noticed within this time.
const horizonRefresh = 5 * time.Second

// clockSkew is how far apart the database's and the broker's clocks are
// assumed to be at most.
const clockSkew = time.Second

// horizon is how far back the work stream remembers publications: a
// publication under a Nats-Msg-Id it saw within its duplicate window, into
// the same stream, is dropped; any other is a new message. A row claimed for
// its first attempt beyond that horizon may have been published, claimed and
// called before a database rewind lost every trace of it.
type horizon struct {
	js     jetstream.JetStream
	stream string

	mu      sync.Mutex
	window  time.Duration // the stream's duplicate window
	created time.Time     // when the stream was created (the broker's clock)
}

// refresh reads the stream's duplicate window and creation time; what it
// cannot read leaves the last values.
func (h *horizon) refresh(ctx context.Context) error {
	str, err := h.js.Stream(ctx, h.stream)
	if err != nil {
		return err
	}
	info := str.CachedInfo()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.window, h.created = info.Config.Duplicates, info.Created
	return nil
}

// run refreshes the horizon until ctx is done.
func (h *horizon) run(ctx context.Context, timeout time.Duration) {
	t := time.NewTicker(horizonRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		_ = h.refresh(rctx) // the last values stand until the broker answers
		cancel()
	}
}

// beyond reports whether a row inserted at created, age ago (both by the
// database clock), is older than the stream's memory of publications: older
// than its duplicate window (less a minute, or half the window, for the
// clocks and the relay's time to publish), or than the stream itself.
func (h *horizon) beyond(age time.Duration, created time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	margin := min(h.window/2, time.Minute)
	// A row inserted within clockSkew of the stream's creation counts as
	// inserted after it: such a row can hardly have been published into
	// an earlier stream, and a fresh deployment's first rows are many.
	return age > h.window-margin || created.Before(h.created.Add(-clockSkew))
}
