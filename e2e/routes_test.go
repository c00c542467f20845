package e2e

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sendonce/sendonce/internal/testing/testcert"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// The cluster's routes are closed to a server that is not one of its
// nodes: two nodes load deploy/nats/cluster.conf as run.sh starts it (the
// route password, the route TLS files and the route URLs from the
// environment), only the ports moved to this host, and route to each
// other. Rogue servers dial a node's route port: one with neither the
// password nor a certificate, one with the nodes' own certificate but no
// password, one with the password and a certificate of another CA. None
// becomes a route, and none receives what a client publishes on sms.send,
// while the second node does.
func TestClusterRoutesNeedPasswordAndTLS(t *testing.T) {
	dir := t.TempDir()
	// The route certificate serves both ends of a route, as the nodes'
	// one file pair must; so does the rogue's, from a CA of its own.
	ca := testcert.NewCA(t, "sendonce routes test CA")
	caFile := ca.WriteFile(t, dir)
	routeCert, routeKey := ca.Issue(t, dir, "route")
	rogueCert, rogueKey := testcert.NewCA(t, "rogue CA").Issue(t, dir, "rogue")

	const password = "route-pw-0123456789abcdef"
	for _, u := range []string{"ADMIN", "RELAY", "SENDER", "OPERATOR"} {
		t.Setenv("NATS_"+u+"_PASSWORD", "pw-"+strings.ToLower(u))
	}
	t.Setenv("NATS_SERVER_NAME", "n")
	t.Setenv("NATS_ROUTE_PASSWORD", password)
	t.Setenv("NATS_ROUTE_CERT", routeCert)
	t.Setenv("NATS_ROUTE_KEY", routeKey)
	t.Setenv("NATS_ROUTE_CA", caFile)
	routePorts := []int{testport.Reserve(t), testport.Reserve(t), testport.Reserve(t)}
	for i, p := range routePorts {
		t.Setenv(fmt.Sprintf("NATS_ROUTE_%d", i+1), fmt.Sprintf("nats-route://route:%s@localhost:%d", password, p))
	}

	// What the file says about routes, before any port is moved.
	file, err := server.ProcessConfigFile("../deploy/nats/cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	if file.Cluster.Username == "" || file.Cluster.Password != password {
		t.Fatalf("deploy/nats/cluster.conf: routes need no password (cluster authorization user %q)", file.Cluster.Username)
	}
	if tc := file.Cluster.TLSConfig; tc == nil || tc.ClientAuth != tls.RequireAndVerifyClientCert || tc.ClientCAs == nil {
		t.Fatal("deploy/nats/cluster.conf: routes without TLS verifying both ends (cluster tls with ca_file and verify: true)")
	}
	if len(file.Routes) != 3 || file.Routes[0].User == nil {
		t.Fatalf("deploy/nats/cluster.conf: routes %v, want three URLs carrying the route user", file.Routes)
	}

	// node loads the file as node i (of the first two), on this host.
	node := func(i int) *server.Server {
		t.Helper()
		o, err := server.ProcessConfigFile("../deploy/nats/cluster.conf")
		if err != nil {
			t.Fatal(err)
		}
		o.ServerName = fmt.Sprintf("n%d", i+1)
		o.Host, o.Port, o.HTTPPort = "127.0.0.1", testport.Reserve(t), 0
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", routePorts[i]
		o.Routes = o.Routes[:2] // the third node is not started
		o.JetStream = false     // routes are what is tested
		o.NoLog, o.NoSigs = true, true
		// A user of the test's, who may read sms.send (no deployed user
		// may), for the control below.
		o.Users = append(o.Users, &server.User{Username: "watcher", Password: "pw-watcher"})
		return startServer(t, o)
	}
	n1, n2 := node(0), node(1)
	waitRoutes(t, n1, 1, 20*time.Second)
	waitRoutes(t, n2, 1, 20*time.Second)

	rogue := func(name, user, pass, certFile, keyFile, caFile string) *server.Server {
		t.Helper()
		o := &server.Options{ServerName: name, Host: "127.0.0.1", Port: testport.Reserve(t), NoLog: true, NoSigs: true}
		o.Cluster.Name = "sendonce"
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", testport.Reserve(t)
		u := fmt.Sprintf("nats-route://localhost:%d", routePorts[0])
		if user != "" {
			u = fmt.Sprintf("nats-route://%s:%s@localhost:%d", user, pass, routePorts[0])
		}
		o.Routes = server.RoutesFromStr(u)
		if certFile != "" {
			tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
				CertFile: certFile, KeyFile: keyFile, CaFile: caFile, Verify: true, Timeout: 2,
			})
			if err != nil {
				t.Fatal(err)
			}
			o.Cluster.TLSConfig, o.Cluster.TLSTimeout = tc, 2
		}
		return startServer(t, o)
	}
	rogues := []*server.Server{
		rogue("rogue-plain", "", "", "", "", ""),
		rogue("rogue-stolen-cert", "", "", routeCert, routeKey, caFile),
		rogue("rogue-own-ca", "route", password, rogueCert, rogueKey, caFile),
	}

	sub := func(s *server.Server, user string) *nats.Subscription {
		t.Helper()
		var opts []nats.Option
		if user != "" {
			opts = append(opts, nats.UserInfo(user, "pw-"+user), nats.CustomInboxPrefix("_INBOX_"+user))
		}
		nc, err := nats.Connect(s.ClientURL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		sb, err := nc.SubscribeSync("sms.send")
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	var spies []*nats.Subscription
	for _, r := range rogues {
		spies = append(spies, sub(r, ""))
	}
	// The control: a client of n2 reads what is published on n1.
	control := sub(n2, "watcher")
	pub, err := nats.Connect(n1.ClientURL(), nats.UserInfo("relay", "pw-relay"), nats.CustomInboxPrefix("_INBOX_relay"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)

	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if err := pub.Publish("sms.send", []byte(`{"id":"00000000-0000-0000-0000-000000000001","gen":0}`)); err != nil {
			t.Fatal(err)
		}
		_ = pub.Flush()
		time.Sleep(100 * time.Millisecond)
	}
	for i, r := range rogues {
		if n := r.NumRoutes(); n != 0 {
			t.Errorf("%s became a route (%d routes)", r.Name(), n)
		}
		if m, err := spies[i].NextMsg(100 * time.Millisecond); err == nil {
			t.Errorf("%s read sms.send: %d bytes", r.Name(), len(m.Data))
		}
	}
	if peers := routePeers(t, n1); len(peers) != 1 || peers[0] != "n2" {
		t.Errorf("n1 routes to %v, want n2 only", peers)
	}
	if _, err := control.NextMsg(time.Second); err != nil {
		t.Errorf("n2 did not receive what n1's client published: %v", err)
	}
}

func startServer(t *testing.T, o *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s did not start", o.ServerName)
	}
	return s
}

// routePeers are the names of the servers s has routes to.
func routePeers(t *testing.T, s *server.Server) []string {
	t.Helper()
	rz, err := s.Routez(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rz.Routes {
		if !slices.Contains(out, r.RemoteName) {
			out = append(out, r.RemoteName)
		}
	}
	return out
}

func waitRoutes(t *testing.T, s *server.Server, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for s.NumRoutes() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d routes after %s, want %d", s.Name(), s.NumRoutes(), d, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
