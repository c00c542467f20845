package sender

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/streams"
)

// shareDecay is the weight of one pick in a lane's running share: its share
// is an average over about the last 64 picks.
const shareDecay = 1.0 / 64

// lane is one priority's consumer and the messages fetched from it, held by
// heartbeats while they wait for a slot and a token.
type lane struct {
	streams.Lane
	// minShare is the least part of the picks this lane gets while it has
	// messages waiting, however busy the lanes above it are.
	minShare float64
	// share is the lane's part of the recent picks.
	share float64
	msgs  chan held
	it    jetstream.MessagesContext
	taken prometheus.Counter
}

// lanes picks the next message to claim: the most urgent lane with a
// message waiting, unless a lower lane has fallen below its minimum share.
type lanes struct {
	all     []*lane // most urgent first
	arrived chan struct{}
}

// pullHeartbeat is the idle heartbeat the senders ask of each pull.
const pullHeartbeat = 5 * time.Second

// newLanes opens an iterator on every lane's consumer. Each lane prefetches
// at most buffer messages from JetStream, and holds as many more.
func (s *Sender) newLanes(ctx context.Context, buffer int) (*lanes, error) {
	ls := &lanes{arrived: make(chan struct{}, 1)}
	shares := map[int]float64{1: 0, 2: s.cfg.NormalMinShare, 3: s.cfg.BulkMinShare}
	for _, l := range streams.Lanes {
		cons, err := s.cfg.JetStream.Consumer(ctx, s.cfg.Stream, l.Consumer)
		if err != nil {
			ls.stop()
			return nil, fmt.Errorf("sender: look up consumer %s on stream %s: %w", l.Consumer, s.cfg.Stream, err)
		}
		cc := cons.CachedInfo().Config
		if hb := heartbeatInterval(cc); s.heartbeat == 0 || hb < s.heartbeat {
			s.heartbeat = hb
		}
		s.maxDeliver[l.Consumer] = cc.MaxDeliver
		// A pull the server never answered (sent while the consumer was
		// missing or changing leader) is noticed when heartbeats stop: at
		// 2x the heartbeat, 30s with the library's 15s, a stall after a
		// broker's store loss measured here. 5s bounds it at about 10s.
		it, err := cons.Messages(jetstream.PullMaxMessages(buffer), jetstream.PullHeartbeat(pullHeartbeat))
		if err != nil {
			ls.stop()
			return nil, fmt.Errorf("sender: consume %s: %w", l.Consumer, err)
		}
		ls.all = append(ls.all, &lane{
			Lane: l, minShare: shares[l.Priority], msgs: make(chan held, buffer), it: it,
			taken: s.metrics.laneTaken.WithLabelValues(l.Name),
		})
	}
	return ls, nil
}

// read moves one lane's messages into its channel, each held by heartbeats
// from here on, until the iterator is stopped.
func (s *Sender) readLane(ctx context.Context, ls *lanes, l *lane) {
	failures := 0
	for {
		m, err := l.it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return
			}
			failures++
			s.health.fetchFailed()
			s.log.Warn("fetch failed", "lane", l.Name, "err", err)
			if !sleep(ctx, min(5*time.Second, 50*time.Millisecond<<min(failures, 7))) {
				return
			}
			continue
		}
		failures = 0
		s.health.fetched()
		h := held{msg: m, keep: keepAlive(m, s.heartbeat)}
		if md, err := m.Metadata(); err == nil {
			h.md = md
		}
		select {
		case l.msgs <- h:
			signal(ls.arrived)
		case <-ctx.Done():
			// Fetched but never started: hand it back for another sender.
			h.answer(func(m jetstream.Msg) { _ = m.Nak() })
			return
		}
	}
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
	return <-chosen.msgs, true
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

// stop stops fetching on every lane: Drain hands the iterators' buffered
// messages back to their readers, which nak them.
func (ls *lanes) stop() {
	for _, l := range ls.all {
		l.it.Drain()
	}
}

// giveBack naks every message held and not picked, for another sender.
func (ls *lanes) giveBack() {
	for _, l := range ls.all {
		for len(l.msgs) > 0 {
			(<-l.msgs).answer(func(m jetstream.Msg) { _ = m.Nak() })
		}
	}
}
