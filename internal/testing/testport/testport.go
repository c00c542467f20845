// Package testport hands tests TCP ports that a restart can take back.
//
// A port picked by listening on port 0 comes from the kernel's ephemeral
// range, the same range every other port-0 listener and every outgoing
// connection draws from. A test that stops a server (a broker restart, a
// partition) and starts it again on the same port can then find it taken by
// someone else in the meantime. Reserve draws from below the ephemeral range
// instead, where only explicit binds land, and never hands out the same port
// twice in one process.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	taken = map[int]bool{}
)

// Reserve returns a port on 127.0.0.1 that was free a moment ago and lies
// below the ephemeral range. Bind it at once; another process can still race
// for it, so a caller that fails to bind should ask again.
func Reserve(t testing.TB) int {
	t.Helper()
	p, err := Pick()
	if err != nil {
		t.Fatalf("testport: %v", err)
	}
	return p
}

// Pick is Reserve for a caller without a test (the soak, the drills).
func Pick() (int, error) {
	lo, hi := window()
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		p := lo + rand.IntN(hi-lo)
		if taken[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		taken[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free port in [%d, %d)", lo, hi)
}

// window is [20000, start of the ephemeral range), or [20000, 32768) when the
// range cannot be read.
func window() (lo, hi int) {
	lo, hi = 20000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) == 2 {
		if start, err := strconv.Atoi(f[0]); err == nil && start > lo+1000 {
			hi = start
		}
	}
	return lo, hi
}

// Addr is "127.0.0.1:" + a reserved port.
func Addr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Reserve(t))
}
