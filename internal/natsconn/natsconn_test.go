package natsconn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/testcert"
)

func connect(t *testing.T, cfg natsconn.Config) error {
	t.Helper()
	cfg.ConnectTimeout = 5 * time.Second
	nc, _, err := natsconn.Connect(cfg)
	if err == nil {
		nc.Close()
	}
	return err
}

func TestToken(t *testing.T) {
	t.Parallel()
	srv := natstest.StartWith(t, func(o *server.Options) { o.Authorization = "s3cret-token" })
	if err := connect(t, natsconn.Config{URL: srv.URL(), Token: "s3cret-token"}); err != nil {
		t.Fatal(err)
	}
	err := connect(t, natsconn.Config{URL: srv.URL(), Token: "wrong"})
	if err == nil || !strings.Contains(err.Error(), "NATS_TOKEN") {
		t.Fatalf("wrong token: %v", err)
	}
	err = connect(t, natsconn.Config{URL: srv.URL()})
	if err == nil || !strings.Contains(err.Error(), "none is set") {
		t.Fatalf("no credentials: %v", err)
	}
}

func TestNKey(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartWith(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	if err := connect(t, natsconn.Config{URL: srv.URL(), NKeySeedFile: seedFile}); err != nil {
		t.Fatal(err)
	}
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	otherFile := filepath.Join(t.TempDir(), "other.nk")
	_ = os.WriteFile(otherFile, otherSeed, 0o600)
	if err := connect(t, natsconn.Config{URL: srv.URL(), NKeySeedFile: otherFile}); err == nil || !strings.Contains(err.Error(), "NATS_NKEY") {
		t.Fatalf("unknown nkey: %v", err)
	}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testcert.NewCA(t, "sendonce test CA")
	caFile := ca.WriteFile(t, dir)
	srvCert, srvKey := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := ca.Issue(t, dir, "client", x509.ExtKeyUsageClientAuth)

	srv := natstest.StartWith(t, func(o *server.Options) {
		cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: srvCert, KeyFile: srvKey, CaFile: caFile, Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		cfg.MinVersion = tls.VersionTLS12
		o.TLSConfig, o.TLS, o.TLSVerify = cfg, true, true
	})
	url := "tls://127.0.0.1:" + strconv.Itoa(srv.Port())
	if err := connect(t, natsconn.Config{URL: url, CAFile: caFile, CertFile: cliCert, KeyFile: cliKey}); err != nil {
		t.Fatal(err)
	}
	if err := connect(t, natsconn.Config{URL: url, CAFile: caFile}); err == nil {
		t.Fatal("connected without a client certificate")
	}
	if err := connect(t, natsconn.Config{URL: url}); err == nil || !strings.Contains(err.Error(), "NATS_CA") {
		t.Fatalf("unverifiable server: %v", err)
	}
}

func TestBindValidates(t *testing.T) {
	t.Parallel()
	cases := map[string]map[string]string{
		"two methods":    {"NATS_TOKEN": "x", "NATS_USER": "u", "NATS_PASSWORD": "p"},
		"user only":      {"NATS_USER": "u"},
		"cert only":      {"NATS_CERT": "/etc/hostname"},
		"missing creds":  {"NATS_CREDS": "/nonexistent/user.creds"},
		"bad url":        {"NATS_URL": "http://x"},
		"bad seed":       {"NATS_URL": "nats://127.0.0.1:4222,http://x"},
		"empty seed":     {"NATS_URL": "nats://127.0.0.1:4222,,nats://127.0.0.1:4223"},
		"inbox wildcard": {"NATS_INBOX_PREFIX": "_INBOX_relay.>"},
		"inbox dot":      {"NATS_INBOX_PREFIX": "_INBOX_relay."},
	}
	for name, env := range cases {
		var c natsconn.Config
		s := envflag.New("t", func(k string) string { return env[k] }, &strings.Builder{})
		natsconn.Bind(s, &c)
		if err := s.Parse(nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A cluster's seeds are a comma-separated list, spaces allowed.
func TestBindAcceptsSeeds(t *testing.T) {
	t.Parallel()
	env := map[string]string{"NATS_URL": "nats://10.0.0.1:4222, nats://10.0.0.2:4222,tls://10.0.0.3:4222"}
	var c natsconn.Config
	s := envflag.New("t", func(k string) string { return env[k] }, &strings.Builder{})
	natsconn.Bind(s, &c)
	if err := s.Parse(nil); err != nil {
		t.Fatal(err)
	}
	urls, err := natsconn.SplitURL(c.URL)
	if err != nil || len(urls) != 3 || urls[1] != "nats://10.0.0.2:4222" {
		t.Fatalf("SplitURL = %q, %v", urls, err)
	}
}

// Credentials bound for a server other than this host need TLS (a tls://
// or wss:// URL, NATS_CA or NATS_CERT) or NATS_ALLOW_INSECURE=true; the
// refusal names both and never the credential.
func TestCredentialsOffThisHostNeedTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	seed := filepath.Join(dir, "user.nk")
	for _, f := range []string{ca, seed} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		env map[string]string
		ok  bool
	}{
		{map[string]string{"NATS_URL": "nats://nats.example:4222"}, true}, // no credentials
		{map[string]string{"NATS_URL": "nats://127.0.0.1:4222", "NATS_USER": "u", "NATS_PASSWORD": "s3cret-pw"}, true},
		{map[string]string{"NATS_URL": "nats://localhost:4222", "NATS_TOKEN": "s3cret-token"}, true},
		{map[string]string{"NATS_URL": "nats://[::1]:4222", "NATS_TOKEN": "s3cret-token"}, true},
		{map[string]string{"NATS_URL": "tls://nats.example:4222", "NATS_TOKEN": "s3cret-token"}, true},
		{map[string]string{"NATS_URL": "wss://nats.example:443", "NATS_TOKEN": "s3cret-token"}, true},
		{map[string]string{"NATS_URL": "nats://nats.example:4222", "NATS_TOKEN": "s3cret-token", "NATS_CA": ca}, true},
		{map[string]string{"NATS_URL": "nats://nats.example:4222", "NATS_TOKEN": "s3cret-token", "NATS_ALLOW_INSECURE": "true"}, true},

		{map[string]string{"NATS_URL": "nats://nats.example:4222", "NATS_USER": "u", "NATS_PASSWORD": "s3cret-pw"}, false},
		{map[string]string{"NATS_URL": "nats://10.0.0.7:4222", "NATS_TOKEN": "s3cret-token"}, false},
		{map[string]string{"NATS_URL": "ws://nats.example:80", "NATS_TOKEN": "s3cret-token"}, false},
		{map[string]string{"NATS_URL": "nats://nats.example:4222", "NATS_NKEY": seed}, false},
		{map[string]string{"NATS_URL": "nats://nats.example:4222", "NATS_CREDS": seed}, false},
		{map[string]string{"NATS_URL": "nats://u:s3cret-pw@nats.example:4222"}, false},
		{map[string]string{"NATS_URL": "tls://a.example:4222,nats://b.example:4222", "NATS_TOKEN": "s3cret-token"}, false},
		{map[string]string{"NATS_URL": "nats://127.0.0.1:4222,nats://b.example:4222", "NATS_TOKEN": "s3cret-token"}, false},
	}
	for _, tt := range cases {
		var c natsconn.Config
		s := envflag.New("t", func(k string) string { return tt.env[k] }, &strings.Builder{})
		natsconn.Bind(s, &c)
		err := s.Parse(nil)
		if tt.ok != (err == nil) {
			t.Errorf("%v: Parse = %v, want ok %v", tt.env, err, tt.ok)
			continue
		}
		if err != nil {
			if msg := err.Error(); !strings.Contains(msg, "NATS_URL") || !strings.Contains(msg, "NATS_ALLOW_INSECURE=true") || strings.Contains(msg, "s3cret") {
				t.Errorf("%v: error %q does not name NATS_URL and NATS_ALLOW_INSECURE, or holds the credential", tt.env, msg)
			}
		}
	}
}

// A user allowed to subscribe to its own inbox prefix only gets its
// JetStream replies with NATS_INBOX_PREFIX, and none without it.
func TestInboxPrefix(t *testing.T) {
	t.Parallel()
	perms := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.INFO"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_relay.>"}},
	}
	srv := natstest.StartWith(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "relay", Password: "pw", Permissions: perms}}
	})
	info := func(prefix string) error {
		nc, js, err := natsconn.Connect(natsconn.Config{URL: srv.URL(), User: "relay", Password: "pw", InboxPrefix: prefix, ConnectTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	}
	if err := info("_INBOX_relay"); err != nil {
		t.Fatalf("with NATS_INBOX_PREFIX=_INBOX_relay: %v", err)
	}
	if err := info(""); err == nil {
		t.Fatal("the default _INBOX got a reply the user may not subscribe to")
	}
}
