//go:build linux

package provider_test

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

// fullBacklog returns the address of a loopback listener that never accepts
// and whose accept queue is already full, so Linux drops every further SYN:
// a connect to it times out, as to a host that does not answer. Only
// loopback is used.
func fullBacklog(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// Backlog 0: the queue holds one connection (Linux allows backlog+1).
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return addr
		}
		if err != nil {
			t.Fatalf("fill backlog: %v", err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("the accept queue never filled up: connect timeouts cannot be simulated on this kernel's loopback")
	return ""
}

func TestSendConnectTimeout(t *testing.T) {
	t.Parallel()
	addr := fullBacklog(t)
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			const connect = 150 * time.Millisecond
			c := newClient(t, "http://"+addr, mode.idempotent, func(cfg *provider.Config) {
				cfg.ConnectTimeout = connect
				cfg.Timeout = 10 * time.Second
			})
			o := send(t, c)
			// Nothing reached the provider: safe to retry even without keys.
			if o.Kind != provider.Retry || o.HTTPStatus != 0 {
				t.Fatalf("outcome %+v, want Retry with no status", o)
			}
			if !strings.Contains(o.Reason, "not sent") || !strings.Contains(o.Reason, "connect timeout") {
				t.Errorf("Reason = %q, want \"request not sent: connect timeout\"", o.Reason)
			}
			// The connect bound ended the attempt, not the overall one.
			if o.Latency < connect || o.Latency >= 5*time.Second {
				t.Errorf("Latency = %s, want about the %s connect timeout", o.Latency, connect)
			}
		})
	}
}
