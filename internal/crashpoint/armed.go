//go:build sendonce_crashpoints

package crashpoint

import (
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Enabled reports whether this build has crash points; it has.
const Enabled = true

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
	for _, spec := range strings.Split(os.Getenv(Env), ",") {
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
