package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/console"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/service"
)

// consoleConfig is what relay console needs: the connections, where to
// listen, who may log in.
type consoleConfig struct {
	service.Settings
	addr          string
	usersFile     string
	users         []console.User
	tlsCert       string
	tlsKey        string
	allowInsecure bool
	secureCookie  bool
	sessionTTL    time.Duration
	refresh       time.Duration
	proxiesList   string
	proxies       []netip.Prefix
	// The budget of password checks (console.Config.LoginRate and the
	// rest).
	loginRate, loginTotalRate   float64
	loginBurst, loginTotalBurst int
}

func bindConsole(s *envflag.Set, c *consoleConfig) {
	s.Intro(`relay console serves the operator console (overview, dead letters and replay, a message's timeline) on CONSOLE_ADDR until SIGINT or SIGTERM.
"relay console user NAME ROLE" reads a password on stdin and prints the users-file line for it.`)
	service.BindConnections(s, &c.Settings)
	s.String(&c.addr, "console-addr", "CONSOLE_ADDR", "", "address the console listens on, such as 127.0.0.1:8089")
	s.Required(&c.addr, "console-addr")
	s.String(&c.usersFile, "console-users-file", "CONSOLE_USERS_FILE", "", "file of the users who may log in: one a line, name:bcrypt-hash:role (viewer or operator), # comments")
	s.Check(func() error {
		if strings.TrimSpace(c.usersFile) == "" {
			return errors.New("-console-users-file / CONSOLE_USERS_FILE is required: a file of name:bcrypt-hash:role lines; " +
				"`relay console user NAME ROLE` prints one, reading the password on stdin (ROLE: viewer or operator)")
		}
		return nil
	})
	s.Check(func() error {
		if c.usersFile == "" {
			return nil
		}
		users, err := console.LoadUsers(c.usersFile)
		if err != nil {
			return fmt.Errorf("CONSOLE_USERS_FILE: %w", err)
		}
		c.users = users
		return nil
	})
	s.String(&c.tlsCert, "console-tls-cert", "CONSOLE_TLS_CERT", "", "certificate file (PEM) to serve HTTPS; with CONSOLE_TLS_KEY")
	s.String(&c.tlsKey, "console-tls-key", "CONSOLE_TLS_KEY", "", "private key file (PEM) of CONSOLE_TLS_CERT")
	s.Bool(&c.allowInsecure, "console-allow-insecure", "CONSOLE_ALLOW_INSECURE", false,
		"serve plain HTTP on a CONSOLE_ADDR other than this host's loopback (passwords and session cookies would cross the network in clear; for a TLS proxy on another host, say so here)")
	s.Check(func() error {
		switch {
		case (c.tlsCert == "") != (c.tlsKey == ""):
			return errors.New("CONSOLE_TLS_CERT and CONSOLE_TLS_KEY go together")
		case c.addr != "" && c.tlsCert == "" && !c.allowInsecure && !service.LoopbackListen(c.addr):
			return errors.New("-console-addr / CONSOLE_ADDR is not on this host's loopback and the console has no TLS: " +
				"set CONSOLE_TLS_CERT and CONSOLE_TLS_KEY, listen on 127.0.0.1 behind a TLS proxy, " +
				"or set CONSOLE_ALLOW_INSECURE=true to serve passwords and session cookies in clear")
		}
		return nil
	})
	s.Bool(&c.secureCookie, "console-secure-cookie", "CONSOLE_SECURE_COOKIE", false, "mark the session cookie Secure, for a console behind an HTTPS proxy (automatic with CONSOLE_TLS_CERT)")
	s.String(&c.proxiesList, "console-trusted-proxies", "CONSOLE_TRUSTED_PROXIES", "", "addresses and CIDR prefixes (comma-separated) of the proxies in front of the console whose X-Forwarded-For names the client; failed logins count per client address, so set it behind a proxy")
	s.Check(func() error {
		p, err := console.ParseTrustedProxies(c.proxiesList)
		if err != nil {
			return fmt.Errorf("CONSOLE_TRUSTED_PROXIES: %w", err)
		}
		c.proxies = p
		return nil
	})
	s.Float(&c.loginRate, "console-login-rate", "CONSOLE_LOGIN_RATE", console.DefaultLoginRate, 0.001, 1000,
		"password checks (bcrypt comparisons) a second one client address may ask for, sustained; past them and CONSOLE_LOGIN_BURST a login is answered 429 with Retry-After before its password is checked")
	s.Int(&c.loginBurst, "console-login-burst", "CONSOLE_LOGIN_BURST", console.DefaultLoginBurst, 1, 10_000, "password checks one client address may ask for at once")
	s.Float(&c.loginTotalRate, "console-login-total-rate", "CONSOLE_LOGIN_TOTAL_RATE", console.DefaultLoginTotalRate, 0.01, 10_000,
		"password checks a second for every client together: bounds the CPU logins take, whatever the number of addresses (a check is some 60 ms at bcrypt cost 10)")
	s.Int(&c.loginTotalBurst, "console-login-total-burst", "CONSOLE_LOGIN_TOTAL_BURST", console.DefaultLoginTotalBurst, 1, 100_000, "password checks every client together may ask for at once")
	s.Duration(&c.sessionTTL, "console-session-ttl", "CONSOLE_SESSION_TTL", console.DefaultSessionTTL, time.Minute, 30*24*time.Hour, "how long a login lasts")
	s.Duration(&c.refresh, "console-refresh", "CONSOLE_REFRESH", console.DefaultRefresh, time.Second, time.Hour, "how often the overview refreshes itself")
	s.Duration(&c.DBTimeout, "db-timeout", "DB_TIMEOUT", outbox.DefaultDBTimeout, 100*time.Millisecond, 10*time.Minute, "bound on the database and NATS work of one page")
	s.Enum(&c.LogFormat, "log-format", "LOG_FORMAT", "json", []string{"json", "text"}, "log format")
	s.Enum(&c.LogLevel, "log-level", "LOG_LEVEL", "info", []string{"debug", "info", "warn", "error"}, "log level")
}

// runConsole is "relay console".
func runConsole(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "user" {
		return consoleUser(args[1:], os.Stdin, stdout, stderr)
	}
	var c consoleConfig
	s := envflag.New("relay console", getenv, stderr)
	bindConsole(s, &c)
	root, code := service.Parse("relay console", s, args, &c.Settings, stderr)
	if root == nil {
		return code
	}
	log := root.With("component", "console")
	if err := serveConsole(ctx, c, root, log, stdout); err != nil {
		log.Error("console failed", "err", err)
		return 1
	}
	return 0
}

func serveConsole(ctx context.Context, c consoleConfig, root, log *slog.Logger, stdout io.Writer) error {
	// As every long-running command: the same connection checks, and a
	// schema older than this release's migrations refused (the console
	// reads what 0011 added).
	pool, err := service.OpenDatabase(ctx, c.Database, service.Options{Name: "sendonce-console"}, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, js, err := natsconn.Connect(service.NATSConfig(c.NATS, service.Options{Name: "sendonce-console"}, log))
	if err != nil {
		return err
	}
	defer nc.Close()
	con, err := console.New(console.Config{
		Pool: pool, JetStream: js, Users: c.users, Logger: root, DBTimeout: c.DBTimeout,
		SessionTTL: c.sessionTTL, Refresh: c.refresh, SecureCookie: c.secureCookie || c.tlsCert != "",
		TrustedProxies: c.proxies, LoginRate: c.loginRate, LoginBurst: c.loginBurst,
		LoginTotalRate: c.loginTotalRate, LoginTotalBurst: c.loginTotalBurst,
	})
	if err != nil {
		return err
	}
	ln, scheme, err := service.Listen(c.addr, c.tlsCert, c.tlsKey, "CONSOLE")
	if err != nil {
		return err
	}
	log.Info("console started", "addr", ln.Addr().String(), "users", len(c.users), "tls", c.tlsCert != "")
	if c.tlsCert == "" && !service.LoopbackListen(c.addr) {
		log.Warn("console serves plain HTTP off this host (CONSOLE_ALLOW_INSECURE): passwords and session cookies cross the network in clear unless a TLS proxy is in front")
	}
	if _, err := fmt.Fprintf(stdout, "%s%s://%s\n", console.Announcement, scheme, ln.Addr()); err != nil {
		ln.Close()
		return err
	}
	if err := con.Serve(ctx, ln); err != nil {
		return err
	}
	log.Info("console stopped")
	return nil
}

// consoleUser is "relay console user NAME ROLE": it reads the password
// from the first line of stdin and prints the users-file line.
func consoleUser(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: relay console user NAME ROLE   (ROLE: viewer or operator; the password is read from stdin)")
		return 2
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(stderr, "relay console user: read the password: %v\n", err)
		return 1
	}
	out, err := console.UserLine(args[0], console.Role(args[1]), strings.TrimRight(line, "\r\n"))
	if err != nil {
		fmt.Fprintf(stderr, "relay console user: %v\n", err)
		return 2
	}
	fmt.Fprintln(stdout, out)
	return 0
}
