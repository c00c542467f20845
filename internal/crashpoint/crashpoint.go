// Package crashpoint kills the process at named points of the protocol, for
// the chaos tests and the soak: a real SIGKILL where a crash hurts most
// (between a PubAck and the queued write, between the provider's accept and
// the status write). It does nothing unless SENDONCE_CRASHPOINTS is set.
//
//	SENDONCE_CRASHPOINTS="relay.after_puback=3"       die at the 3rd hit
//	SENDONCE_CRASHPOINTS="sender.after_accept=0.01"   die at each hit with p=0.01
//
// Several points are separated by commas.
package crashpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"math/rand/v2"
)

// The points the code declares.
const (
	// RelayAfterPubAck: a batch is in JetStream, its rows not yet queued.
	RelayAfterPubAck = "relay.after_puback"
	// SenderAfterAccept: the provider accepted, the status is not written.
	SenderAfterAccept = "sender.after_accept"
)

type point struct {
	nth  int64   // die at this hit (1-based); 0 = unused
	prob float64 // die with this probability per hit
	hits atomic.Int64
}

var (
	once   sync.Once
	points map[string]*point
	armed  atomic.Bool
)

func load() {
	points = map[string]*point{}
	for _, spec := range strings.Split(os.Getenv("SENDONCE_CRASHPOINTS"), ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(spec), "=")
		if !ok || name == "" {
			continue
		}
		p := &point{}
		if n, err := strconv.ParseInt(val, 10, 64); err == nil && n >= 1 {
			p.nth = n
		} else if f, err := strconv.ParseFloat(val, 64); err == nil && f > 0 && f < 1 {
			p.prob = f
		} else {
			continue
		}
		points[name] = p
	}
	armed.Store(len(points) > 0)
}

// Hit kills the process with SIGKILL if the named point is armed and due.
func Hit(name string) {
	once.Do(load)
	if !armed.Load() {
		return
	}
	p := points[name]
	if p == nil {
		return
	}
	n := p.hits.Add(1)
	if (p.nth > 0 && n == p.nth) || (p.prob > 0 && rand.Float64() < p.prob) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never return to the protocol after "dying"
	}
}
