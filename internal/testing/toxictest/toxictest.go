// Package toxictest puts an in-process toxiproxy between a test's client and
// a real server, so that a test injects real network faults (lost responses,
// resets, latency, cut connections) on real sockets.
package toxictest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/sendonce/sendonce/internal/testing/testport"
)

// Proxy is a TCP proxy with toxics.
type Proxy struct {
	t     testing.TB
	proxy *toxiproxy.Proxy
}

// New starts a proxy to upstream (host:port) on a random local port, stopped
// when the test ends.
func New(t testing.TB, upstream string) *Proxy {
	t.Helper()
	// The port comes from testport, not from the kernel's ephemeral range,
	// so that it is still free when Enable listens on it again.
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	var p *toxiproxy.Proxy
	var err error
	for range 5 {
		p = toxiproxy.NewProxy(srv, t.Name(), testport.Addr(t), upstream)
		if err = p.Start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("toxictest: start proxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{t: t, proxy: p}
}

// Addr returns the proxy's listen address.
func (p *Proxy) Addr() string { return p.proxy.Listen }

// Add adds a toxic. stream is "downstream" (server to client: responses) or
// "upstream" (client to server: requests); attrs are the toxic's attributes,
// e.g. {"timeout": 0} for a timeout toxic.
func (p *Proxy) Add(name, typ, stream string, attrs map[string]any) {
	p.t.Helper()
	body, _ := json.Marshal(map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	})
	if _, err := p.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		p.t.Fatalf("toxictest: add toxic %s: %v", name, err)
	}
}

// Remove removes a toxic; the connections it held are released.
func (p *Proxy) Remove(name string) {
	p.t.Helper()
	if err := p.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		p.t.Fatalf("toxictest: remove toxic %s: %v", name, err)
	}
}

// URL returns "http://" + Addr().
func (p *Proxy) URL() string { return fmt.Sprintf("http://%s", p.Addr()) }

// Disable closes every connection through the proxy and refuses new ones: a
// partition. Enable heals it.
func (p *Proxy) Disable() { p.proxy.Stop() }

// Enable starts accepting connections again after Disable.
func (p *Proxy) Enable() {
	p.t.Helper()
	if err := p.proxy.Start(); err != nil {
		p.t.Fatalf("toxictest: re-enable proxy: %v", err)
	}
}
