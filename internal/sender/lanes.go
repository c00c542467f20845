package sender

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/backoff"
	"github.com/sendonce/sendonce/internal/streams"
)

// shareDecay is the weight of one pick in a lane's running share: its share
// is an average over about the last 64 picks.
const shareDecay = 1.0 / 64

// lane is one priority's consumer and the messages fetched from it, held by
// heartbeats from the moment they arrive while they wait for a slot and a
// token.
type lane struct {
	streams.Lane
	// minShare is the least part of the picks this lane gets while it has
	// messages waiting, however busy the lanes above it are.
	minShare float64
	// share is the lane's part of the recent picks.
	share float64
	msgs  chan held
	// picked tells the lane's reader that the claim loop took a message:
	// there may be room for a fetch.
	picked chan struct{}
	cons   jetstream.Consumer
	taken  prometheus.Counter
}

// lanes picks the next message to claim: the most urgent lane with a
// message waiting, unless a lower lane has fallen below its minimum share.
type lanes struct {
	all     []*lane // most urgent first
	arrived chan struct{}

	mu sync.Mutex
	// back is closed, and replaced, each time the NATS connection is
	// re-established: a pull sent before may have been lost with the old
	// connection (a restarted server forgets it).
	back chan struct{}
}

const (
	// pullExpiry is how long one fetch waits for messages at most; the
	// server answers an idle one at its end, and the reader fetches again.
	pullExpiry = 30 * time.Second
	// pullHeartbeat is the idle heartbeat the senders ask of each fetch. A
	// pull the server never answered (sent while the consumer was missing
	// or changing leader) is noticed when heartbeats stop, at twice this.
	pullHeartbeat = 5 * time.Second
)

// newLanes looks up every lane's consumer. Each lane holds up to 2*buffer
// messages, and fetches when it holds buffer or fewer.
func (s *Sender) newLanes(ctx context.Context, buffer int) (*lanes, error) {
	ls := &lanes{arrived: make(chan struct{}, 1), back: make(chan struct{})}
	shares := map[int]float64{1: 0, 2: s.cfg.NormalMinShare, 3: s.cfg.BulkMinShare}
	for _, l := range streams.Lanes {
		cons, err := s.cfg.JetStream.Consumer(ctx, s.cfg.Stream, l.Consumer)
		if err != nil {
			return nil, fmt.Errorf("sender: look up consumer %s on stream %s: %w", l.Consumer, s.cfg.Stream, err)
		}
		cc := cons.CachedInfo().Config
		if hb := heartbeatInterval(cc); s.heartbeat == 0 || hb < s.heartbeat {
			s.heartbeat = hb
		}
		s.maxDeliver[l.Consumer] = cc.MaxDeliver
		ls.all = append(ls.all, &lane{
			Lane: l, minShare: shares[l.Priority], msgs: make(chan held, 2*buffer), picked: make(chan struct{}, 1),
			cons: cons, taken: s.metrics.laneTaken.WithLabelValues(l.Name),
		})
	}
	return ls, nil
}

// readLane fetches one lane's messages into its channel until ctx is done.
// It asks for no more than the channel has room for, so every message is
// held by heartbeats from the moment it arrives: none waits unheld in a
// client's buffer while the rate limit holds the lane back, long enough
// for JetStream to deliver it again. It fetches once the lane is half
// empty, as many as fit, so that a busy lane fetches in batches.
func (s *Sender) readLane(ctx context.Context, ls *lanes, l *lane) {
	failures := 0
	for {
		for len(l.msgs) > cap(l.msgs)/2 {
			select {
			case <-l.picked:
			case <-ctx.Done():
				return
			}
		}
		err := s.fetch(ctx, ls, l, cap(l.msgs)-len(l.msgs))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			s.health.fetchFailed()
			s.log.Warn("fetch failed", "lane", l.Name, "err", err)
			if !backoff.Sleep(ctx, min(5*time.Second, 50*time.Millisecond<<min(failures, 7))) {
				return
			}
			continue
		}
		failures = 0
	}
}

// fetch pulls up to n messages from the lane's consumer, and moves each
// into the lane as it arrives, held by heartbeats from then on. It returns
// when the pull is answered (n messages, or its expiry), when the
// connection comes back (the pull may be lost; the reader pulls again), or
// when ctx is done.
func (s *Sender) fetch(ctx context.Context, ls *lanes, l *lane, n int) error {
	back := ls.reconnects()
	fctx, cancel := context.WithTimeout(ctx, pullExpiry)
	defer cancel()
	batch, err := l.cons.Fetch(n, jetstream.FetchContext(fctx), jetstream.FetchHeartbeat(pullHeartbeat))
	if err != nil {
		return fmt.Errorf("pull %s: %w", l.Consumer, err)
	}
	msgs, again := batch.Messages(), false
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				err := batch.Error()
				if err == nil || again && errors.Is(err, context.Canceled) {
					s.health.pulled()
					return nil
				}
				return fmt.Errorf("pull %s: %w", l.Consumer, err)
			}
			s.hold(ctx, ls, l, m)
		case <-back:
			back, again = nil, true
			cancel()
		}
	}
}

// hold starts the heartbeats of a fetched message and puts it in its lane;
// at shutdown it hands the message back instead.
func (s *Sender) hold(ctx context.Context, ls *lanes, l *lane, m jetstream.Msg) {
	s.health.fetched()
	h := held{msg: m, keep: keepAlive(m, s.heartbeat)}
	if md, err := m.Metadata(); err == nil {
		h.md = md
	}
	// The fetch asked for no more than the room, and only this reader adds
	// to the lane: the send does not wait.
	select {
	case l.msgs <- h:
		signal(ls.arrived)
	case <-ctx.Done():
		// Fetched but never started: hand it back for another sender.
		s.handBack(context.WithoutCancel(ctx), []held{h}, nil)
	}
}

// reconnects returns a channel closed when the NATS connection is next
// re-established.
func (ls *lanes) reconnects() <-chan struct{} {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.back
}

// reconnected wakes every reader whose pull went out before the
// connection came back.
func (ls *lanes) reconnected() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	close(ls.back)
	ls.back = make(chan struct{})
}

// pick takes the next message without waiting, if one is there. Only the
// claim loop calls it.
func (ls *lanes) pick() (held, bool) {
	var chosen *lane
	// A lower lane owed its minimum share goes first, the lowest first.
	for i := len(ls.all) - 1; i > 0 && chosen == nil; i-- {
		if l := ls.all[i]; l.share < l.minShare && len(l.msgs) > 0 {
			chosen = l
		}
	}
	for _, l := range ls.all {
		if chosen == nil && len(l.msgs) > 0 {
			chosen = l
		}
	}
	if chosen == nil {
		return held{}, false
	}
	for _, l := range ls.all {
		l.share *= 1 - shareDecay
		if l == chosen {
			l.share += shareDecay
		}
	}
	chosen.taken.Inc()
	h := <-chosen.msgs
	signal(chosen.picked)
	return h, true
}

// wait waits until a message is waiting in some lane; false when ctx is
// done first.
func (ls *lanes) wait(ctx context.Context) bool {
	for ls.waiting() == 0 {
		select {
		case <-ls.arrived:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// waiting is the number of messages held and not yet picked.
func (ls *lanes) waiting() int {
	n := 0
	for _, l := range ls.all {
		n += len(l.msgs)
	}
	return n
}

// unpicked takes every message held and not picked, for a sender that
// stops: it hands them back, for another sender.
func (ls *lanes) unpicked() []held {
	var out []held
	for _, l := range ls.all {
		for len(l.msgs) > 0 {
			out = append(out, <-l.msgs)
		}
	}
	return out
}
