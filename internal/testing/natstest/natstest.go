// Package natstest runs an embedded NATS server with JetStream for a test, on
// a random port with its store in the test's temporary directory, and creates
// the streams and consumers from the repository's nats/ files.
package natstest

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/embednats"
	"github.com/sendonce/sendonce/internal/testing/natscluster"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// Server is a test's NATS server. Restart keeps its port and store.
type Server struct {
	t    testing.TB
	dir  string
	port int
	opts func(*server.Options)
	srv  *server.Server
}

// Start starts a server for t, shut down when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with a hook that adjusts the server options (auth, TLS).
func StartWith(t testing.TB, opts func(*server.Options)) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), opts: opts}
	// The port comes from testport, not from the kernel's ephemeral range,
	// so that it is still free when a test restarts the server on it.
	var err error
	for range 5 {
		s.port = testport.Reserve(t)
		s.srv, err = embednats.Start(embednats.Config{Port: s.port, StoreDir: s.dir, Options: opts})
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// URL returns the client URL, stable across restarts.
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// StoreDir is the server's JetStream store directory: a test that deletes
// it while the server is stopped simulates a lost disk.
func (s *Server) StoreDir() string { return s.dir }

// Port returns the client port.
func (s *Server) Port() int { return s.port }

// Stop shuts the server down and waits until it is gone.
func (s *Server) Stop() {
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart stops the server (if running) and starts it again on the same port
// and store directory.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.srv, err = embednats.Start(embednats.Config{Port: s.port, StoreDir: s.dir, Options: s.opts})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("natstest: restart: %v", err)
	}
}

// Connect returns a connection closed when the test ends.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL(), opts...)
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// EnsureTopology creates the streams and consumers of nats/ on the server.
func (s *Server) EnsureTopology(t testing.TB) *streams.Topology {
	t.Helper()
	topo, err := streams.Default()
	if err != nil {
		t.Fatalf("natstest: load topology: %v", err)
	}
	_, js := s.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topo.Ensure(ctx, js); err != nil {
		t.Fatalf("natstest: ensure topology: %v", err)
	}
	return topo
}

// DeployedUsers loads the users and permission sets of a deployment's
// nats-server config (deploy/nats/nats.conf, which includes auth.conf),
// each with the password "pw-" + its name, set through the variables the
// file reads them from: t.Setenv, so t may not run in parallel.
func DeployedUsers(t testing.TB, conf string) []*server.User {
	t.Helper()
	for _, u := range []string{"ADMIN", "RELAY", "SENDER", "OPERATOR"} {
		t.Setenv("NATS_"+u+"_PASSWORD", "pw-"+strings.ToLower(u))
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return opts.Users
}

// StartCluster starts a JetStream cluster of n nats-server processes for t
// (see natscluster: a node can be killed with SIGKILL and its store wiped),
// stopped when t ends; each node's log is shown if t fails.
func StartCluster(t testing.TB, n int) *natscluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := natscluster.BuildCached(ctx)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	dir := t.TempDir()
	c, err := natscluster.Start(ctx, natscluster.Config{
		Bin: bin, Dir: dir, Nodes: n,
		Port: func() (int, error) { return testport.Reserve(t), nil },
		Logf: t.Logf,
	})
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for _, node := range c.Nodes() {
				if b, err := os.ReadFile(node.LogPath()); err == nil {
					t.Logf("nats %s log (last 4 KiB):\n%s", node.Name, tail(b, 4096))
				}
			}
		}
	})
	return c
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
