package sender

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// keepAlive tells JetStream the message is still being worked on every
// interval, so a slow provider call or status write does not outlive the ack
// deadline and get the message redelivered to another sender. It returns the
// function that stops it.
func keepAlive(m jetstream.Msg, interval time.Duration) (stop func()) {
	// A timer, not a goroutine: most messages are answered long before the
	// first beat, and stopping costs the status writer no handoff. The
	// lock orders a beat before a stop, so none follows the answer.
	var (
		mu      sync.Mutex
		t       *time.Timer
		stopped bool
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(interval, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		_ = m.InProgress()
		t.Reset(interval)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// heartbeatInterval returns a third of the consumer's effective ack
// deadline: with BackOff set, the server uses BackOff[0] instead of AckWait.
func heartbeatInterval(cfg jetstream.ConsumerConfig) time.Duration {
	wait := cfg.AckWait
	if len(cfg.BackOff) > 0 {
		wait = cfg.BackOff[0]
	}
	if wait <= 0 {
		wait = 30 * time.Second
	}
	return max(wait/3, 100*time.Millisecond)
}
