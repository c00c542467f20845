package sender

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// beatCounter is a message that counts its InProgress calls; every other
// method is left to the nil interface (calling one panics).
type beatCounter struct {
	jetstream.Msg
	beats atomic.Int32
}

func (m *beatCounter) InProgress() error { m.beats.Add(1); return nil }

// keepAlive beats every interval until stopped, and never after stop
// returns: the status writer answers JetStream right after.
func TestKeepAlive(t *testing.T) {
	t.Parallel()
	m := &beatCounter{}
	const interval = 10 * time.Millisecond
	stop := keepAlive(m, interval)
	deadline := time.Now().Add(30 * time.Second)
	for m.beats.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d beats in 30s, want at least 3", m.beats.Load())
		}
		time.Sleep(interval)
	}
	stop()
	after := m.beats.Load()
	time.Sleep(10 * interval)
	if got := m.beats.Load(); got != after {
		t.Fatalf("%d beats after stop returned", got-after)
	}

	// Stopped before the first beat: none at all.
	quiet := &beatCounter{}
	keepAlive(quiet, interval)()
	time.Sleep(10 * interval)
	if n := quiet.beats.Load(); n != 0 {
		t.Fatalf("%d beats from a keep-alive stopped at once", n)
	}
}
