// Package natsconn connects the sendonce processes to NATS with the
// reconnect behaviour a long-running worker needs.
package natsconn

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/envflag"
)

// Config says how to connect.
type Config struct {
	// URL is the server URL (or a comma-separated list).
	URL string
	// Name identifies the client in the server's monitoring.
	Name string
	// PublishWindow bounds the asynchronous publications awaiting a PubAck.
	PublishWindow int
	// PublishAckTimeout, when set, abandons an asynchronous publication's
	// PubAck after it, so that acks lost without a reconnect (a stream
	// leader change) do not fill the window for good.
	PublishAckTimeout time.Duration
	// ConnectTimeout bounds the first connection.
	ConnectTimeout time.Duration
	// Logger receives connection events.
	Logger *slog.Logger

	// Auth and TLS. Set at most one of User/Password, Token, NKeySeedFile
	// and CredsFile.
	User, Password string
	Token          string
	// NKeySeedFile is a file holding an nkey seed (NATS_NKEY).
	NKeySeedFile string
	// CredsFile is a JWT creds file (NATS_CREDS).
	CredsFile string
	// CAFile verifies the server's certificate; CertFile and KeyFile are
	// the client certificate for mutual TLS.
	CAFile, CertFile, KeyFile string
	// AllowInsecure (NATS_ALLOW_INSECURE) accepts credentials sent to a
	// server other than this host without TLS: one NATS_URL names, or one
	// the cluster advertises (without it, such a server is not dialled).
	AllowInsecure bool
	// InboxPrefix replaces _INBOX as the prefix of the subjects replies
	// come back on (NATS_INBOX_PREFIX), so that each user may be allowed
	// to subscribe to its own replies only. Empty keeps _INBOX.
	InboxPrefix string
}

// Bind binds the NATS settings to s: NATS_URL, NATS_USER, NATS_PASSWORD
// (or NATS_PASSWORD_FILE), NATS_TOKEN (or NATS_TOKEN_FILE), NATS_NKEY,
// NATS_CREDS, NATS_CA, NATS_CERT, NATS_KEY, NATS_INBOX_PREFIX, each with a
// flag.
func Bind(s *envflag.Set, c *Config) {
	s.Group("NATS")
	s.String(&c.URL, "nats-url", "NATS_URL", "nats://127.0.0.1:4222", "NATS server URL; for a cluster, a comma-separated list of seeds (the client learns the other servers from them)")
	s.String(&c.User, "nats-user", "NATS_USER", "", "NATS user name")
	s.Secret(&c.Password, "nats-password", "NATS_PASSWORD", "NATS password")
	s.Secret(&c.Token, "nats-token", "NATS_TOKEN", "NATS token")
	s.String(&c.NKeySeedFile, "nats-nkey", "NATS_NKEY", "", "file holding an nkey seed")
	s.String(&c.CredsFile, "nats-creds", "NATS_CREDS", "", "NATS creds file (JWT and nkey seed)")
	s.String(&c.CAFile, "nats-ca", "NATS_CA", "", "CA certificate file to verify the NATS server")
	s.String(&c.CertFile, "nats-cert", "NATS_CERT", "", "client certificate file for mutual TLS")
	s.String(&c.KeyFile, "nats-key", "NATS_KEY", "", "client key file for mutual TLS")
	s.Bool(&c.AllowInsecure, "nats-allow-insecure", "NATS_ALLOW_INSECURE", false,
		"accept credentials (NATS_USER/NATS_PASSWORD, NATS_TOKEN, NATS_NKEY, NATS_CREDS, or a URL's user) sent to a server other than this host without TLS (a tls:// or wss:// URL, or NATS_CA or NATS_CERT)")
	s.String(&c.InboxPrefix, "nats-inbox-prefix", "NATS_INBOX_PREFIX", "", "prefix of the subjects replies come back on, instead of _INBOX: give each NATS user its own and allow it to subscribe to PREFIX.> only")
	s.Check(c.validate)
}

func (c *Config) validate() error {
	if _, err := SplitURL(c.URL); err != nil {
		return fmt.Errorf("-nats-url / NATS_URL: %w", err)
	}
	n := 0
	for _, set := range []bool{c.User != "" || c.Password != "", c.Token != "", c.NKeySeedFile != "", c.CredsFile != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return errors.New("NATS_USER/NATS_PASSWORD, NATS_TOKEN, NATS_NKEY and NATS_CREDS are exclusive: set one")
	case (c.User == "") != (c.Password == ""):
		return errors.New("NATS_USER and NATS_PASSWORD go together")
	case (c.CertFile == "") != (c.KeyFile == ""):
		return errors.New("NATS_CERT and NATS_KEY go together")
	}
	if err := c.checkTLS(); err != nil {
		return err
	}
	if err := validInboxPrefix(c.InboxPrefix); err != nil {
		return fmt.Errorf("-nats-inbox-prefix / NATS_INBOX_PREFIX: %w", err)
	}
	for env, f := range map[string]string{"NATS_NKEY": c.NKeySeedFile, "NATS_CREDS": c.CredsFile, "NATS_CA": c.CAFile, "NATS_CERT": c.CertFile, "NATS_KEY": c.KeyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%s: %v", env, err)
		}
	}
	return nil
}

// checkTLS refuses credentials bound for a server other than this host
// over plain nats:// or ws://, where they, and every message after them,
// cross the network in clear, unless AllowInsecure. TLS is a tls:// or
// wss:// URL, or NATS_CA or NATS_CERT (which make the client require it).
func (c *Config) checkTLS() error {
	if c.AllowInsecure || c.CAFile != "" || c.CertFile != "" {
		return nil
	}
	auth := c.User != "" || c.Token != "" || c.NKeySeedFile != "" || c.CredsFile != ""
	urls, _ := SplitURL(c.URL)
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			continue // SplitURL accepted it
		}
		if u.Scheme == "tls" || u.Scheme == "wss" || loopback(u.Hostname()) {
			continue
		}
		if auth || u.User != nil {
			return fmt.Errorf("NATS_URL: credentials would go to server %d of %d, not on this host, without TLS: use a tls:// URL or set NATS_CA, "+
				"or NATS_ALLOW_INSECURE=true to accept it", i+1, len(urls))
		}
	}
	return nil
}

// plainOnly reports whether the connection carries credentials without
// TLS, which checkTLS allows only to servers on this host: then every
// server NATS_URL names is on this host, and a server the cluster
// advertises (INFO connect_urls, which nats.go adds to its pool and tries
// on a reconnect, with the same credentials) must be too. With a tls:// or
// wss:// URL, NATS_CA or NATS_CERT, nats.go requires TLS of every server
// in its pool, discovered ones included, and refuses one without it
// before it sends the credentials.
func (c *Config) plainOnly() bool {
	if c.AllowInsecure || c.CAFile != "" || c.CertFile != "" {
		return false
	}
	auth := c.User != "" || c.Token != "" || c.NKeySeedFile != "" || c.CredsFile != ""
	urls, _ := SplitURL(c.URL)
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		if u.Scheme == "tls" || u.Scheme == "wss" {
			return false
		}
		auth = auth || u.User != nil
	}
	return auth
}

// thisHostDialer dials servers on this host only: it serves a connection
// whose credentials go without TLS (plainOnly), so that a server the
// cluster advertises elsewhere is refused before anything is sent to it,
// as NATS_URL naming it would be at start-up. nats.go resolves a host name
// before it dials, so the address is checked as it will be reached.
type thisHostDialer struct {
	d      net.Dialer
	log    *slog.Logger
	mu     sync.Mutex
	warned map[string]bool
}

// Dial implements nats.CustomDialer.
func (d *thisHostDialer) Dial(network, address string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err == nil && loopback(host) {
		return d.d.Dial(network, address)
	}
	d.mu.Lock()
	first := !d.warned[address]
	d.warned[address] = true
	d.mu.Unlock()
	if first {
		// Once per server: the client tries its pool again and again.
		d.log.Warn("nats server not on this host skipped: the cluster advertised it, and the credentials would reach it without TLS; "+
			"use tls:// URLs or NATS_CA, or NATS_ALLOW_INSECURE=true to accept it", "server", address)
	}
	return nil, fmt.Errorf("nats server %s is not on this host and the connection has no TLS: credentials are not sent to it in clear", address)
}

// validInboxPrefix accepts an empty prefix (the default _INBOX) or a subject
// of non-empty tokens without wildcards or white space.
func validInboxPrefix(p string) error {
	if p == "" {
		return nil
	}
	for _, tok := range strings.Split(p, ".") {
		if tok == "" {
			return fmt.Errorf("%q: an empty token (a leading, trailing or doubled dot)", p)
		}
		if strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("%q: wildcards and white space are not allowed", p)
		}
	}
	return nil
}

// loopback reports whether host is this host: localhost or a loopback
// address.
func loopback(host string) bool {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// SplitURL splits a NATS_URL, one URL or a comma-separated list of cluster
// seeds, and checks each: an absolute nats, tls, ws or wss URL with a host.
func SplitURL(raw string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, errors.New("an empty URL in the list")
		}
		u, err := url.Parse(part)
		if err != nil || u.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme) {
			// The URL may hold a password: say which one by position.
			return nil, fmt.Errorf("URL %d of %d: want an absolute nats, tls, ws or wss URL", len(out)+1, strings.Count(raw, ",")+1)
		}
		out = append(out, part)
	}
	return out, nil
}

// authHint names the settings to check after an authorization failure.
func (c *Config) authHint() string {
	switch {
	case c.User != "":
		return "NATS_USER/NATS_PASSWORD"
	case c.Token != "":
		return "NATS_TOKEN"
	case c.NKeySeedFile != "":
		return "NATS_NKEY"
	case c.CredsFile != "":
		return "NATS_CREDS"
	}
	return "NATS_USER/NATS_PASSWORD, NATS_TOKEN, NATS_NKEY or NATS_CREDS (none is set)"
}

// Connect connects and returns the connection and its JetStream context. The
// connection reconnects forever: a broker outage pauses the work, it does not
// end the process. When no server is reachable at start-up it returns a
// connection that keeps trying in the background (WaitConnected waits for
// it); refused credentials and TLS failures are returned at once.
func Connect(cfg Config) (*nats.Conn, jetstream.JetStream, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(cfg.ConnectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.ReconnectBufSize(32 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: a deliberate close
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "server", nc.ConnectedServerId())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			log.Warn("nats async error", "err", err)
		}),
	}
	switch {
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, nil, fmt.Errorf("NATS_NKEY: %w", err)
		}
		opts = append(opts, o)
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if cfg.CertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	if cfg.plainOnly() {
		opts = append(opts, nats.SetCustomDialer(&thisHostDialer{
			d:   net.Dialer{Timeout: cmp.Or(cfg.ConnectTimeout, nats.DefaultTimeout)},
			log: log, warned: map[string]bool{},
		}))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
			return nil, nil, fmt.Errorf("connect to NATS_URL: authorization failed: check %s: %w", cfg.authHint(), err)
		}
		if tlsFailure(err) {
			return nil, nil, fmt.Errorf("connect to NATS_URL: TLS failed: check NATS_CA, NATS_CERT, NATS_KEY: %w", err)
		}
		// No server reachable now (an outage, a broker that starts after
		// us): connect in the background rather than exit into a crash
		// loop. Refused credentials and TLS failures stay fatal above:
		// retrying cannot fix them.
		log.Warn("nats unreachable at start-up; connecting in the background", "err", err)
		nc, err = nats.Connect(cfg.URL, append(opts, nats.RetryOnFailedConnect(true))...)
		if err != nil {
			return nil, nil, fmt.Errorf("connect to NATS_URL: %w", err)
		}
	}
	jsOpts := []jetstream.JetStreamOpt{}
	if cfg.PublishWindow > 0 {
		// The relay keeps its own window per batch; this is the library's
		// bound, set above it so it never stalls first.
		jsOpts = append(jsOpts, jetstream.WithPublishAsyncMaxPending(2*cfg.PublishWindow))
	}
	if cfg.PublishAckTimeout > 0 {
		jsOpts = append(jsOpts, jetstream.WithPublishAsyncTimeout(cfg.PublishAckTimeout))
	}
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Drain drains nc (pending publications and acks are flushed, subscriptions
// closed) and waits up to timeout for it to close.
func Drain(nc *nats.Conn, timeout time.Duration) error {
	if err := nc.Drain(); err != nil {
		return fmt.Errorf("drain nats connection: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for !nc.IsClosed() {
		if time.Now().After(deadline) {
			nc.Close()
			return fmt.Errorf("nats drain did not finish within %s", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// WaitConnected returns once nc is connected, logging every 10s while it
// waits, or ctx's error when ctx is done first.
func WaitConnected(ctx context.Context, nc *nats.Conn, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	next := start.Add(10 * time.Second)
	for !nc.IsConnected() {
		if nc.IsClosed() {
			return errors.New("nats connection closed while waiting for it")
		}
		if time.Now().After(next) {
			log.Warn("waiting for nats", "waited", time.Since(start).Round(time.Second), "status", nc.Status().String())
			next = time.Now().Add(10 * time.Second)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for nats: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// tlsFailure reports whether err is a TLS handshake failure: ours (the
// server's certificate does not verify) or the server's (a TLS alert, such
// as "certificate required").
func tlsFailure(err error) bool {
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	var recordErr tls.RecordHeaderError
	var opErr *net.OpError
	return errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) ||
		errors.As(err, &invalid) || errors.As(err, &recordErr) ||
		(errors.As(err, &opErr) && opErr.Op == "remote error") ||
		errors.Is(err, nats.ErrTLS) || errors.Is(err, nats.ErrSecureConnRequired) || errors.Is(err, nats.ErrSecureConnWanted)
}
