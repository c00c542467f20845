package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/console"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testcert"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// A bad users file, or a missing setting, stops relay console naming the
// setting, and never quotes the file's hashes.
func TestConsoleBadConfigurationNamesTheSetting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := "alice:$2a$10$eaQ77/8BQBtcM3wPpc58TuzLtllisS5wkNyjvwWB9daP8sdNHHhZS:operator\n"
	base := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/x", "CONSOLE_ADDR": "127.0.0.1:0",
		"CONSOLE_USERS_FILE": write("good", good)}
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"no address", map[string]string{"CONSOLE_ADDR": ""}, "CONSOLE_ADDR"},
		{"no users file", map[string]string{"CONSOLE_USERS_FILE": ""}, "CONSOLE_USERS_FILE"},
		{"users file missing", map[string]string{"CONSOLE_USERS_FILE": filepath.Join(dir, "none")}, "CONSOLE_USERS_FILE"},
		{"plain password", map[string]string{"CONSOLE_USERS_FILE": write("plain", "alice:hunter2hunter2:operator\n")}, "CONSOLE_USERS_FILE: line 1 (user alice): not a bcrypt hash"},
		{"bad role", map[string]string{"CONSOLE_USERS_FILE": write("role", strings.Replace(good, "operator", "root", 1))}, "CONSOLE_USERS_FILE: line 1"},
		{"cert without key", map[string]string{"CONSOLE_TLS_CERT": "/x.pem"}, "CONSOLE_TLS_KEY"},
		{"session ttl", map[string]string{"CONSOLE_SESSION_TTL": "1s"}, "CONSOLE_SESSION_TTL"},
		{"trusted proxies", map[string]string{"CONSOLE_TRUSTED_PROXIES": "10.0.0.0/8, proxy.example"}, `CONSOLE_TRUSTED_PROXIES: "proxy.example" is not an address`},
		{"trusted prefix", map[string]string{"CONSOLE_TRUSTED_PROXIES": "10.0.0.0/33"}, "CONSOLE_TRUSTED_PROXIES"},
		{"no database", map[string]string{"DATABASE_URL": ""}, "DATABASE_URL"},
		{"plain text on every interface", map[string]string{"CONSOLE_ADDR": ":8089"}, "CONSOLE_ALLOW_INSECURE"},
		{"plain text on every IPv4 interface", map[string]string{"CONSOLE_ADDR": "0.0.0.0:8089"}, "CONSOLE_ALLOW_INSECURE"},
		{"plain text on every IPv6 interface", map[string]string{"CONSOLE_ADDR": "[::]:8089"}, "CONSOLE_ALLOW_INSECURE"},
		{"plain text on a host's address", map[string]string{"CONSOLE_ADDR": "192.0.2.10:8089"}, "CONSOLE_TLS_CERT"},
		{"plain text on a host name", map[string]string{"CONSOLE_ADDR": "console.example:8089"}, "CONSOLE_ALLOW_INSECURE"},
		{"plain text behind a proxy elsewhere", map[string]string{"CONSOLE_ADDR": ":8089", "CONSOLE_SECURE_COOKIE": "true"}, "CONSOLE_ALLOW_INSECURE"},
		{"login rate", map[string]string{"CONSOLE_LOGIN_RATE": "0"}, "CONSOLE_LOGIN_RATE"},
		{"login burst", map[string]string{"CONSOLE_LOGIN_BURST": "0"}, "CONSOLE_LOGIN_BURST"},
		{"login total rate", map[string]string{"CONSOLE_LOGIN_TOTAL_RATE": "x"}, "CONSOLE_LOGIN_TOTAL_RATE"},
		{"login total burst", map[string]string{"CONSOLE_LOGIN_TOTAL_BURST": "-1"}, "CONSOLE_LOGIN_TOTAL_BURST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.env {
				env[k] = v
			}
			var out, errOut testkit.Buffer
			code := run(context.Background(), []string{"relay", "console"}, testkit.EnvMap(env), &out, &errOut)
			if code != 2 || !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 naming %s", code, errOut.String(), tt.want)
			}
			if strings.Contains(errOut.String(), "$2a$") || strings.Contains(errOut.String(), "hunter2") {
				t.Fatalf("stderr quotes the users file: %q", errOut.String())
			}
		})
	}
}

func TestConsoleUserPrintsALineThatLogsIn(t *testing.T) {
	t.Parallel()
	var out, errOut testkit.Buffer
	if code := consoleUser([]string{"alice", "viewer"}, strings.NewReader("a long password\n"), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	users, err := console.ParseUsers(strings.NewReader(out.String()))
	if err != nil || len(users) != 1 || users[0].Name != "alice" || users[0].Role != console.RoleViewer {
		t.Fatalf("line %q: %v", out.String(), err)
	}
	if code := consoleUser([]string{"alice"}, strings.NewReader("x\n"), &out, &errOut); code != 2 {
		t.Fatalf("one argument: exit %d", code)
	}
	if code := consoleUser([]string{"alice", "viewer"}, strings.NewReader("short\n"), &out, &errOut); code != 2 {
		t.Fatalf("short password: exit %d", code)
	}
}

// relay console announces its address, serves the login page, and stops
// cleanly on its context.
func TestConsoleServesUntilStopped(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	ns := natstest.Start(t)
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("# ops\nalice:$2a$10$eaQ77/8BQBtcM3wPpc58TuzLtllisS5wkNyjvwWB9daP8sdNHHhZS:operator\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": ns.URL(), "CONSOLE_ADDR": "127.0.0.1:0", "CONSOLE_USERS_FILE": users}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testkit.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"relay", "console"}, testkit.EnvMap(env), &out, &errOut) }()
	var base string
	testkit.WaitFor(t, 30*time.Second, "the console's announcement", func() bool {
		base, _ = strings.CutPrefix(strings.TrimSpace(out.String()), console.Announcement)
		return base != "" && base != strings.TrimSpace(out.String())
	})
	res, err := http.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /login: %s", res.Status)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay console did not stop")
	}
}

// startConsole runs relay console with env added to a database, a NATS
// server and a users file holding alice (password "a long password 1"),
// and returns the port it announced; it stops when the test ends.
func startConsole(t *testing.T, env map[string]string) (scheme string, port string) {
	t.Helper()
	line, err := console.UserLine("alice", console.RoleOperator, "a long password 1")
	if err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env["DATABASE_URL"], env["NATS_URL"], env["CONSOLE_USERS_FILE"] = pgtest.NewMigrated(t), natstest.Start(t).URL(), users
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut testkit.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"relay", "console"}, testkit.EnvMap(env), &out, &errOut) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("relay console: exit %d: %s", code, errOut.String())
		}
	})
	var u *url.URL
	testkit.WaitFor(t, 30*time.Second, "the console's announcement", func() bool {
		rest, ok := strings.CutPrefix(strings.TrimSpace(out.String()), console.Announcement)
		if !ok {
			return false
		}
		u, err = url.Parse(rest)
		return err == nil
	})
	return u.Scheme, u.Port()
}

// A console on an address other than this host's serves HTTPS with
// CONSOLE_TLS_CERT and CONSOLE_TLS_KEY, and its session cookie is Secure
// (as well as HttpOnly and SameSite=Strict), so a browser never sends it
// in clear. Plain text there starts only with CONSOLE_ALLOW_INSECURE.
func TestConsoleOffThisHostServesTLS(t *testing.T) {
	t.Parallel()
	cert, key, pool := testcert.SelfSigned(t, t.TempDir())
	scheme, port := startConsole(t, map[string]string{"CONSOLE_ADDR": "0.0.0.0:0", "CONSOLE_TLS_CERT": cert, "CONSOLE_TLS_KEY": key})
	if scheme != "https" {
		t.Fatalf("announced %s, want https", scheme)
	}
	c := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
	res, err := c.PostForm("https://127.0.0.1:"+port+"/login", url.Values{"username": {"alice"}, "password": {"a long password 1"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("login over HTTPS: %s", res.Status)
	}
	cookies := res.Cookies()
	if len(cookies) != 1 || !cookies[0].Secure || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("session cookie over HTTPS: %+v; want one, Secure, HttpOnly, SameSite=Strict", cookies)
	}

	scheme, port = startConsole(t, map[string]string{"CONSOLE_ADDR": "0.0.0.0:0", "CONSOLE_ALLOW_INSECURE": "true"})
	if scheme != "http" {
		t.Fatalf("announced %s, want http", scheme)
	}
	res, err = http.Get("http://127.0.0.1:" + port + "/login")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /login in plain text, allowed: %s", res.Status)
	}
}
