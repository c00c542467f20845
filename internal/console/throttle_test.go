package console_test

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sendonce/sendonce/internal/console"
)

// clientFrom is a client whose connections come from the loopback address
// ip (any of 127.0.0.0/8 on Linux), as another host's would.
func (f *fixture) clientFrom(ip string) *http.Client {
	c := f.client()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c.Transport = &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
	return c
}

// try posts a login and returns its status code; forwarded, if not empty,
// is sent as X-Forwarded-For.
func (f *fixture) try(c *http.Client, name, password, forwarded string) int {
	f.t.Helper()
	req, err := http.NewRequest("POST", f.srv.URL+"/login", stringsReader(url.Values{"username": {name}, "password": {password}}.Encode()))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if forwarded != "" {
		req.Header.Set("X-Forwarded-For", forwarded)
	}
	res, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// Failed logins count against the name from one address: a stranger's
// failures elsewhere never refuse alice's right password, and failures
// with many names from one address never refuse victor's, there or
// elsewhere, while the guesser's own pair waits. (The budget of password
// checks, which an address spraying names does spend, is raised here:
// TestPasswordChecksAreBudgeted is about it.)
func TestFailedLoginsElsewhereDoNotLockOutAUser(t *testing.T) {
	t.Parallel()
	f := setupWith(t, func(c *console.Config) { c.LoginBurst, c.LoginTotalBurst = 100, 100 })
	stranger := f.clientFrom("127.0.0.2")
	for i := range 8 {
		if got := f.try(stranger, "alice", fmt.Sprintf("guess %d", i), ""); got != http.StatusUnauthorized && got != http.StatusTooManyRequests {
			t.Fatalf("guess %d: %d", i, got)
		}
	}
	if got := f.try(stranger, "alice", operatorPassword, ""); got != http.StatusTooManyRequests {
		t.Errorf("alice's password from the guessing address: %d, want 429 (the pair waits)", got)
	}
	if got := f.try(f.clientFrom("127.0.0.3"), "alice", operatorPassword, ""); got != http.StatusSeeOther {
		t.Errorf("alice's password from another address: %d, want 303", got)
	}

	sprayer := f.clientFrom("127.0.0.4")
	for i := range 25 {
		f.try(sprayer, fmt.Sprintf("user%02d", i), "spring2026", "")
	}
	if got := f.try(sprayer, "victor", viewerPassword, ""); got != http.StatusSeeOther {
		t.Errorf("victor's password from the spraying address, no failure of his: %d, want 303", got)
	}
	if got := f.try(f.clientFrom("127.0.0.5"), "victor", viewerPassword, ""); got != http.StatusSeeOther {
		t.Errorf("victor's password from another address: %d, want 303", got)
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

// Behind a trusted proxy failed logins count against the client that
// X-Forwarded-For names (its right-most address not a trusted proxy), so
// clients sharing the proxy do not share a throttle; a peer that is not
// a trusted proxy cannot choose its address by sending the header.
func TestForwardedForFromATrustedProxyNamesTheClient(t *testing.T) {
	t.Parallel()
	f := setupWith(t, func(c *console.Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.0.0.0/8")}
	})
	proxy := f.clientFrom("127.0.0.1")
	for i := range 6 {
		// The guesser forges an address on the left; the proxies append.
		f.try(proxy, "alice", fmt.Sprintf("guess %d", i), "192.0.2.77, 198.51.100.7, 10.1.2.3")
	}
	if got := f.try(proxy, "alice", operatorPassword, "198.51.100.7"); got != http.StatusTooManyRequests {
		t.Errorf("alice's password from the guesser's address through the proxy: %d, want 429", got)
	}
	for _, other := range []string{"198.51.100.8", "192.0.2.77"} {
		if got := f.try(proxy, "alice", operatorPassword, other); got != http.StatusSeeOther {
			t.Errorf("alice's password from %s through the proxy: %d, want 303", other, got)
		}
	}
	if logs := f.logs.String(); !strings.Contains(logs, `"remote":"198.51.100.7"`) {
		t.Errorf("the failed logins are not logged with the client's address:\n%s", logs)
	}

	// A peer that is not a trusted proxy: the header is ignored.
	direct := f.clientFrom("127.0.0.2")
	for i := range 6 {
		f.try(direct, "victor", fmt.Sprintf("guess %d", i), fmt.Sprintf("203.0.113.%d", i))
	}
	if got := f.try(direct, "victor", viewerPassword, "203.0.113.200"); got != http.StatusTooManyRequests {
		t.Errorf("victor's password from the guessing peer with a new X-Forwarded-For: %d, want 429", got)
	}
}

// What a client sends before it is authenticated is bounded: a login
// form over 4 KiB is refused (413), and a name that no users file could
// hold (the file's pattern: 1 to 64 of A-Z a-z 0-9 . _ @ -) is refused
// before it reaches the throttle, the log or the page.
func TestLoginInputIsBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.clientFrom("127.0.0.6")
	huge := strings.Repeat("a", 1<<19)
	for range 3 {
		if got := f.try(c, huge, "guess", ""); got != http.StatusRequestEntityTooLarge {
			t.Fatalf("a 512 KiB name: %d, want 413", got)
		}
	}
	for _, name := range []string{strings.Repeat("b", 65), "al ice", "<script>", "alice\x00", ""} {
		if got := f.try(c, name, "guess", ""); got != http.StatusUnauthorized {
			t.Errorf("name %q: %d, want 401", name, got)
		}
	}
	if addrs, pairs, names := f.con.ThrottleSize(); addrs+pairs+names != 0 {
		t.Fatalf("the throttle holds %d addresses, %d pairs, %d names after invalid names", addrs, pairs, names)
	}
	if logs := f.logs.String(); strings.Contains(logs, "bbbbbbbbbb") || strings.Contains(logs, "al ice") || strings.Contains(logs, "aaaaaaaaaa") {
		t.Fatal("an invalid name was logged")
	}
	// A valid name counts.
	f.try(c, "mallory", "guess", "")
	if addrs, pairs, _ := f.con.ThrottleSize(); addrs != 1 || pairs != 1 {
		t.Fatalf("after one failure: %d addresses, %d pairs", addrs, pairs)
	}
}

// An unknown name is compared against a hash of the highest cost in the
// users file, so it takes as long as the slowest user's wrong password.
func TestUnknownNamesCostTheFilesHighestCost(t *testing.T) {
	t.Parallel()
	dearer, err := bcrypt.GenerateFromPassword([]byte("a dearer password"), bcrypt.MinCost+1)
	if err != nil {
		t.Fatal(err)
	}
	f := setupWith(t, func(c *console.Config) {
		c.Users = append(slices.Clone(users()), console.User{Name: "dora", Hash: dearer, Role: console.RoleViewer})
	})
	if got, want := f.con.DummyHashCost(), bcrypt.MinCost+1; got != want {
		t.Fatalf("the dummy hash has cost %d, the file's highest is %d", got, want)
	}
	// And it spends its time: an unknown name is refused like a wrong password.
	if got := f.try(f.client(), "nobody", "guess", ""); got != http.StatusUnauthorized {
		t.Fatalf("an unknown name: %d", got)
	}
}

// clock is a console clock that moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// tryWait posts a login and returns its status code and Retry-After.
func (f *fixture) tryWait(c *http.Client, name, password string) (int, time.Duration) {
	f.t.Helper()
	res, _ := f.do(c, "POST", "/login", url.Values{"username": {name}, "password": {password}})
	var wait time.Duration
	if ra := res.Header.Get("Retry-After"); ra != "" {
		s, err := strconv.Atoi(ra)
		if err != nil || s < 1 {
			f.t.Fatalf("Retry-After %q: want a positive number of seconds", ra)
		}
		wait = time.Duration(s) * time.Second
	}
	return res.StatusCode, wait
}

// Every password check is a bcrypt comparison (some 60 ms of CPU at the
// users file's least cost), and a name nobody has failed with is never
// stopped by the failure throttle: a client posting fresh names could
// make the console compare hashes without pause. So the checks are
// budgeted before the comparison, per client address and in all: past a
// budget a login is answered 429 with Retry-After and costs nothing.
// Another address keeps its own budget; once the whole console's is
// spent, everybody waits, for no longer than Retry-After says.
func TestPasswordChecksAreBudgeted(t *testing.T) {
	t.Parallel()
	f := setup(t)
	clk := &clock{now: time.Now()}
	f.con.SetNow(clk.Now)

	spray := f.clientFrom("127.0.0.7")
	checked, refused := 0, 0
	for i := range 40 {
		switch code, wait := f.tryWait(spray, fmt.Sprintf("fresh%02d", i), "spring2026"); code {
		case http.StatusUnauthorized:
			checked++
		case http.StatusTooManyRequests:
			refused++
			if wait == 0 {
				t.Fatalf("fresh name %d: 429 without Retry-After", i)
			}
		default:
			t.Fatalf("fresh name %d: %d", i, code)
		}
	}
	if checked > 20 || refused == 0 {
		t.Fatalf("40 fresh names from one address: %d password checks, %d refused (429); want at most 20 checks", checked, refused)
	}
	if code, _ := f.tryWait(f.clientFrom("127.0.0.8"), "alice", operatorPassword); code != http.StatusSeeOther {
		t.Fatalf("alice from another address while one address is over its budget: %d, want 303", code)
	}

	// Many addresses, two fresh names each: the console's budget ends it.
	checked = 0
	var wait time.Duration
	for a := 10; a < 60; a++ {
		c := f.clientFrom(fmt.Sprintf("127.0.0.%d", a))
		for i := range 2 {
			code, w := f.tryWait(c, fmt.Sprintf("bot%d_%d", a, i), "spring2026")
			if code == http.StatusUnauthorized {
				checked++
			}
			wait = max(wait, w)
		}
	}
	if checked > 40 {
		t.Fatalf("100 fresh names from 50 addresses: %d password checks; want the console's budget to stop most", checked)
	}
	home := f.clientFrom("127.0.0.9")
	code, w := f.tryWait(home, "victor", viewerPassword)
	if code != http.StatusTooManyRequests || w == 0 || w > time.Minute {
		t.Fatalf("victor with the console's budget spent: %d, Retry-After %s; want 429 and a short wait", code, w)
	}
	clk.Add(w)
	if code, _ := f.tryWait(home, "victor", viewerPassword); code != http.StatusSeeOther {
		t.Fatalf("victor after Retry-After: %d, want 303", code)
	}
}
