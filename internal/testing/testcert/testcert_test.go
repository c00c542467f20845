package testcert_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/testing/testcert"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// handshake runs one TLS handshake on 127.0.0.1 between a server and a
// client with the configurations given, and returns each end's error.
// Under TLS 1.3 the client finishes before the server has checked the
// client's certificate, so a refused client certificate shows in
// serverErr only.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		done <- tls.Server(c, server).Handshake()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	clientErr = tls.Client(c, client).Handshake()
	if clientErr != nil {
		// The server is waiting for the client's next flight; closing
		// ends its handshake too.
		c.Close()
	}
	return <-done, clientErr
}

func keyPair(t *testing.T, certFile, keyFile string) []tls.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return []tls.Certificate{pair}
}

// A client that trusts the CA, through its written file or its pool,
// verifies a server certificate it issued, under 127.0.0.1 and localhost
// and no other name; a client that trusts another CA does not.
func TestIssuedServerIsTrustedThroughTheCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testcert.NewCA(t, "testcert test CA")
	cert, key := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	server := &tls.Config{Certificates: keyPair(t, cert, key), MinVersion: tls.VersionTLS12}

	caPEM, err := os.ReadFile(ca.WriteFile(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(caPEM, ca.PEM) {
		t.Fatal("the CA file does not hold the CA's PEM")
	}
	fromFile := x509.NewCertPool()
	if !fromFile.AppendCertsFromPEM(caPEM) {
		t.Fatal("the CA file holds no certificate")
	}
	for _, tt := range []struct {
		name string
		pool *x509.CertPool
	}{{"127.0.0.1", ca.Pool()}, {"localhost", ca.Pool()}, {"127.0.0.1", fromFile}} {
		if _, err := handshake(t, server, &tls.Config{RootCAs: tt.pool, ServerName: tt.name, MinVersion: tls.VersionTLS12}); err != nil {
			t.Errorf("as %s: %v", tt.name, err)
		}
	}
	if _, err := handshake(t, server, &tls.Config{RootCAs: ca.Pool(), ServerName: "server.example", MinVersion: tls.VersionTLS12}); err == nil {
		t.Error("the certificate verified for server.example, a name it was not issued for")
	}
	other := testcert.NewCA(t, "testcert other CA")
	if _, err := handshake(t, server, &tls.Config{RootCAs: other.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}); err == nil {
		t.Error("a client trusting another CA verified the server")
	}
}

// Under mutual TLS a server that trusts the CA accepts a client
// certificate it issued, and refuses no certificate, one of another CA,
// and one issued for servers only. A certificate issued with no usages
// serves at both ends, as a NATS route's does.
func TestIssuedClientIsAcceptedUnderMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testcert.NewCA(t, "testcert test CA")
	other := testcert.NewCA(t, "testcert other CA")
	srvCert, srvKey := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := ca.Issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	bothCert, bothKey := ca.Issue(t, dir, "both")
	rogueCert, rogueKey := other.Issue(t, dir, "rogue", x509.ExtKeyUsageClientAuth)

	mutual := func(certs []tls.Certificate) *tls.Config {
		return &tls.Config{Certificates: certs, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	}
	// client offers its certificate whatever CAs the server names: crypto/tls
	// would otherwise keep back one of another CA, and the server's check
	// of it would go untested.
	client := func(certs []tls.Certificate) *tls.Config {
		cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		if certs != nil {
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
		}
		return cfg
	}
	for _, tt := range []struct {
		name           string
		server, client []tls.Certificate
		accepted       bool
	}{
		{"client certificate", keyPair(t, srvCert, srvKey), keyPair(t, cliCert, cliKey), true},
		{"both ends' certificate", keyPair(t, bothCert, bothKey), keyPair(t, bothCert, bothKey), true},
		{"no certificate", keyPair(t, srvCert, srvKey), nil, false},
		{"another CA's", keyPair(t, srvCert, srvKey), keyPair(t, rogueCert, rogueKey), false},
		{"a server's", keyPair(t, srvCert, srvKey), keyPair(t, srvCert, srvKey), false},
	} {
		serverErr, clientErr := handshake(t, mutual(tt.server), client(tt.client))
		if tt.accepted && (serverErr != nil || clientErr != nil) {
			t.Errorf("%s: refused: server %v, client %v", tt.name, serverErr, clientErr)
		}
		if !tt.accepted && serverErr == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
}

// A self-signed certificate serves 127.0.0.1 to a client trusting the
// pool returned with it, and its key is readable by its owner alone.
func TestSelfSigned(t *testing.T) {
	t.Parallel()
	cert, key, pool := testcert.SelfSigned(t, t.TempDir())
	server := &tls.Config{Certificates: keyPair(t, cert, key), MinVersion: tls.VersionTLS12}
	if _, err := handshake(t, server, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}); err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, server, &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}); err == nil {
		t.Error("a client trusting nothing verified the self-signed certificate")
	}
	fi, err := os.Stat(key)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
	}
}
