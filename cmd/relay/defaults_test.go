package main

import (
	"io"
	"net"
	"testing"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// /metrics, /healthz and /readyz serve this host only unless HTTP_ADDR
// says otherwise.
func TestHTTPAddrDefaultsToLoopback(t *testing.T) {
	t.Parallel()
	var c config
	bind(envflag.New("relay", testkit.EnvMap(nil), io.Discard), &c)
	host, _, err := net.SplitHostPort(c.HTTPAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		t.Fatalf("HTTP_ADDR default %q: want a loopback address", c.HTTPAddr)
	}
}
