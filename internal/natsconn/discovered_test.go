package natsconn_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/testcert"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// hostAddr returns an IPv4 address of this host that is not a loopback
// one: a server listening there counts as another host's.
func hostAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("this host has no IPv4 address but loopback ones to put a server on")
	return ""
}

// wiretap forwards TCP connections to a server and keeps what clients
// send, as anyone on the network path could.
type wiretap struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	conns    int
	sent     bytes.Buffer
}

func newWiretap(t *testing.T, host string) *wiretap {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	w := &wiretap{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			w.mu.Lock()
			w.conns++
			up := w.upstream
			w.mu.Unlock()
			s, err := net.Dial("tcp", up)
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() { _, _ = io.Copy(c, s); c.Close() })
			wg.Go(func() { _, _ = io.Copy(s, io.TeeReader(c, w)); s.Close() })
		}
	})
	return w
}

func (w *wiretap) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent.Write(p)
}

func (w *wiretap) saw(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Contains(w.sent.Bytes(), []byte(s))
}

func (w *wiretap) connections() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conns
}

// serverTLS makes a CA and a server certificate for 127.0.0.1 and returns
// the server's TLS config and the CA file.
func serverTLS(t *testing.T) (*tls.Config, string) {
	t.Helper()
	dir := t.TempDir()
	ca := testcert.NewCA(t, "sendonce test CA")
	cert, key := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, ca.WriteFile(t, dir)
}

// A cluster tells its clients the other servers' client URLs (INFO
// connect_urls), and the client adds them to its pool. The rule NATS_URL
// is held to holds for them too: credentials go to a server not on this
// host only over TLS. Here the seed is the client's only server, node b
// (another host's address, seen through a wiretap) advertises a
// plain-text client port, and the seed goes away: the client must not
// send b the password in clear, whether the seed is a plain-text server
// on this host or a TLS server. With NATS_ALLOW_INSECURE it may.
func TestDiscoveredServersGetCredentialsOnlyOverTLS(t *testing.T) {
	t.Parallel()
	host := hostAddr(t)
	const password = "pw-never-in-clear-4711"
	for _, tt := range []struct {
		name     string
		tls      bool
		insecure bool
		// leak: the client connects to b and sends the password.
		leak bool
	}{
		{name: "plain-text seed on this host"},
		{name: "TLS seed", tls: true},
		{name: "allowed insecure", insecure: true, leak: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			users := []*server.User{{Username: "relay", Password: password}}
			routePort := testport.Reserve(t)
			var caFile string
			seed := natstest.StartWith(t, func(o *server.Options) {
				o.JetStream = false
				o.ServerName = "a"
				o.Users = users
				o.Cluster = server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: routePort}
				if tt.tls {
					o.TLSConfig, caFile = serverTLS(t)
					o.TLS = true
				}
			})
			tap := newWiretap(t, host)
			b := natstest.StartWith(t, func(o *server.Options) {
				o.JetStream = false
				o.ServerName = "b"
				o.Users = users
				o.Host = host
				o.ClientAdvertise = tap.ln.Addr().String()
				o.Cluster = server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: -1}
				o.Routes = server.RoutesFromStr("nats://127.0.0.1:" + strconv.Itoa(routePort))
			})
			tap.mu.Lock()
			tap.upstream = net.JoinHostPort(host, strconv.Itoa(b.Port()))
			tap.mu.Unlock()

			url := seed.URL()
			if tt.tls {
				url = "tls://127.0.0.1:" + strconv.Itoa(seed.Port())
			}
			logs := &testkit.Buffer{}
			nc, _, err := natsconn.Connect(natsconn.Config{
				URL: url, User: "relay", Password: password, CAFile: caFile, AllowInsecure: tt.insecure,
				ConnectTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			testkit.WaitFor(t, 30*time.Second, "the client to learn of b from the cluster", func() bool {
				return slices.ContainsFunc(nc.DiscoveredServers(), func(u string) bool { return strings.HasSuffix(u, tap.ln.Addr().String()) })
			})

			seed.Stop()
			// The client goes round its pool: the seed, down, and b. It
			// either sends b the password or is stopped before: by its own
			// refusal (logged) before it dials b, or by nats.go after b
			// says it has no TLS.
			testkit.WaitFor(t, 30*time.Second, "the client to try b", func() bool {
				return tap.saw(password) || strings.Contains(logs.String(), "without TLS") || tap.connections() >= 2
			})
			if leaked := tap.saw(password); leaked != tt.leak {
				t.Fatalf("the password went to the discovered server %s in clear: %v, want %v\nclient log:\n%s", tap.ln.Addr(), leaked, tt.leak, logs.String())
			}
			if !tt.tls && !tt.leak && tap.connections() != 0 {
				t.Fatalf("the client connected to the discovered server %s without TLS (%d connections)", tap.ln.Addr(), tap.connections())
			}
			if !tt.leak && strings.Contains(logs.String(), password) {
				t.Fatalf("the log holds the password:\n%s", logs.String())
			}
		})
	}
}
