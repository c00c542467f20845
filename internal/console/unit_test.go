package console

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/bcrypt"

	"github.com/sendonce/sendonce/internal/outbox"
)

func TestParseUsers(t *testing.T) {
	t.Parallel()
	good, err := bcrypt.GenerateFromPassword([]byte("correct horse battery"), MinCost)
	if err != nil {
		t.Fatal(err)
	}
	weak, err := bcrypt.GenerateFromPassword([]byte("correct horse battery"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	h := string(good)
	tests := []struct {
		name, file string
		users      int
		wantErr    string
	}{
		{"two users, comments, blank lines", "# console users\n\nalice:" + h + ":operator\n  bob:" + h + ":viewer  \n", 2, ""},
		{"empty", "# nobody\n", 0, "no users"},
		{"two fields", "alice:" + h + "\n", 0, "line 1: want name:bcrypt-hash:role"},
		{"bad name", "al ice:" + h + ":viewer\n", 0, "line 1: a user name"},
		{"twice", "alice:" + h + ":viewer\nalice:" + h + ":operator\n", 0, "line 2: user alice appears twice"},
		{"not bcrypt", "alice:plain-password:viewer\n", 0, "line 1 (user alice): not a bcrypt hash"},
		{"cheap hash", "alice:" + string(weak) + ":viewer\n", 0, "bcrypt cost 4 is below 10"},
		{"bad role", "#\nalice:" + h + ":admin\n", 0, `line 2 (user alice): role "admin"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			users, err := ParseUsers(strings.NewReader(tt.file))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "$2a$") || strings.Contains(err.Error(), "plain-password") {
					t.Fatalf("the error quotes a secret: %v", err)
				}
				return
			}
			if err != nil || len(users) != tt.users {
				t.Fatalf("%d users, %v; want %d", len(users), err, tt.users)
			}
		})
	}
}

func TestUserLine(t *testing.T) {
	t.Parallel()
	line, err := UserLine("alice", RoleOperator, "correct horse battery")
	if err != nil {
		t.Fatal(err)
	}
	users, err := ParseUsers(strings.NewReader(line))
	if err != nil || len(users) != 1 {
		t.Fatalf("the line does not parse back: %v", err)
	}
	if _, ok := authenticate(map[string]User{"alice": users[0]}, dummyHash(users), "alice", "correct horse battery"); !ok {
		t.Fatal("the password does not match its line")
	}
	for _, bad := range []struct {
		name string
		role Role
		pw   string
	}{{"alice", "admin", "correct horse battery"}, {"a b", RoleViewer, "correct horse battery"}, {"alice", RoleViewer, "short"}} {
		if _, err := UserLine(bad.name, bad.role, bad.pw); err == nil {
			t.Errorf("UserLine(%q, %q, ...) accepted", bad.name, bad.role)
		}
	}
}

// After loginFree failures a name waits at an address, twice as long after
// each further failure, up to the cap; clearing it lets it in at once.
// Nobody else waits: not the name elsewhere, not another name there.
func TestLimiter(t *testing.T) {
	t.Parallel()
	l := newLimiter()
	now := time.Unix(1_000_000, 0)
	for i := range loginFree - 1 {
		l.fail("alice", "a", true, now)
		if w := l.wait("alice", "a", now); w != 0 {
			t.Fatalf("after %d failures: wait %s", i+1, w)
		}
	}
	l.fail("alice", "a", true, now)
	if w := l.wait("alice", "a", now); w != loginFirstGap {
		t.Fatalf("after %d failures: wait %s, want %s", loginFree, w, loginFirstGap)
	}
	l.fail("alice", "a", true, now)
	if w := l.wait("alice", "a", now); w != 2*loginFirstGap {
		t.Fatalf("one more: wait %s, want %s", w, 2*loginFirstGap)
	}
	for range 40 {
		l.fail("alice", "a", true, now)
	}
	if w := l.wait("alice", "a", now); w != loginMaxGap {
		t.Fatalf("many: wait %s, want the cap %s", w, loginMaxGap)
	}
	if w := l.wait("alice", "a", now.Add(loginMaxGap)); w != 0 {
		t.Fatalf("after the gap: wait %s", w)
	}
	if w := l.wait("alice", "b", now); w != 0 {
		t.Fatalf("alice waits %s at another address", w)
	}
	if w := l.wait("bob", "a", now); w != 0 {
		t.Fatalf("bob waits %s at the guessing address", w)
	}
	l.clear("alice", "a")
	if w := l.wait("alice", "a", now); w != 0 {
		t.Fatalf("after clear: wait %s", w)
	}
}

// Once an address has failed loginSuspect times with any names, a name
// that fails there waits from its first failure; a name that has not
// failed there never waits. Likewise for a name (a user's or not) failing from
// loginSuspect addresses.
func TestLimiterSuspects(t *testing.T) {
	t.Parallel()
	l := newLimiter()
	now := time.Unix(1_000_000, 0)
	for i := range loginSuspect {
		l.fail(fmt.Sprintf("user%d", i), "spray", false, now)
	}
	if w := l.wait("bob", "spray", now); w != 0 {
		t.Fatalf("bob waits %s at the spraying address before any failure", w)
	}
	l.fail("bob", "spray", true, now)
	if w := l.wait("bob", "spray", now); w != loginFirstGap {
		t.Fatalf("bob's first failure at the spraying address: wait %s, want %s", w, loginFirstGap)
	}
	if w := l.wait("bob", "home", now); w != 0 {
		t.Fatalf("bob waits %s at home", w)
	}

	for i := range loginSuspect {
		l.fail("alice", fmt.Sprintf("bot%d", i), true, now)
	}
	if w := l.wait("alice", "office", now); w != 0 {
		t.Fatalf("alice waits %s at the office before any failure", w)
	}
	l.fail("alice", "office", true, now)
	if w := l.wait("alice", "office", now); w != loginFirstGap {
		t.Fatalf("alice's first failure after a distributed guess: wait %s, want %s", w, loginFirstGap)
	}
	// A name nobody has counts alike: the throttle does not tell which
	// names exist.
	for i := range loginSuspect {
		l.fail("zed", fmt.Sprintf("bot%d", i), false, now)
	}
	l.fail("zed", "office", false, now)
	if w := l.wait("zed", "office", now); w != loginFirstGap {
		t.Fatalf("an unknown name's first failure after a distributed guess: wait %s, want %s", w, loginFirstGap)
	}
	// An hour later the counts start over.
	later := now.Add(loginForget + time.Second)
	l.fail("alice", "office", true, later)
	if w := l.wait("alice", "office", later); w != 0 {
		t.Fatalf("an hour later, one failure: wait %s", w)
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{{-time.Second, "0s"}, {850 * time.Millisecond, "850ms"}, {42 * time.Second, "42s"}, {192 * time.Second, "3m12s"},
		{5*time.Hour + 3*time.Minute, "5h03m"}, {52 * time.Hour, "2d04h"}} {
		if got := formatAge(tt.d); got != tt.want {
			t.Errorf("formatAge(%s) = %q, want %q", tt.d, got, tt.want)
		}
	}
	for _, tt := range []struct {
		n    int64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567, "1,234,567"}, {-45000, "-45,000"}} {
		if got := formatNum(tt.n); got != tt.want {
			t.Errorf("formatNum(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestParseSince(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"all", time.Time{}, true},
		{"24h", now.Add(-24 * time.Hour), true},
		{"7d", now.AddDate(0, 0, -7), true},
		{"2026-04-30T00:00:00Z", time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC), true},
		{"0d", time.Time{}, false},
		{"-1h", time.Time{}, false},
		{"yesterday", time.Time{}, false},
	} {
		got, err := parseSince(tt.in, now)
		if (err == nil) != tt.ok || !got.Equal(tt.want) {
			t.Errorf("parseSince(%q) = %s, %v", tt.in, got, err)
		}
	}
}

func TestChart(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 5, 1, 11, 0, 0, 0, time.UTC)
	c := newChart(since, []outbox.MinuteAttempts{
		{Minute: since, Sent: 10, Retry: 5, Failed: 5},
		{Minute: since.Add(59 * time.Minute), Sent: 5},
		{Minute: since.Add(61 * time.Minute), Sent: 1}, // clock skew: into the last bar
	})
	if len(c.Bars) != chartMinutes || c.Max != 20 || c.Sent != 16 || c.Retry != 5 || c.Failed != 5 {
		t.Fatalf("chart %d bars, max %d, sent %d retry %d failed %d", len(c.Bars), c.Max, c.Sent, c.Retry, c.Failed)
	}
	first := c.Bars[0]
	if len(first.Segs) != 3 || first.Segs[0].H != chartPlotH/2 || first.Segs[0].Y != chartPlotH/2 || first.Segs[2].Y != 0 {
		t.Errorf("first bar %+v", first.Segs)
	}
	if last := c.Bars[chartMinutes-1]; last.Counts.Sent != 6 || last.X != (chartMinutes-1)*chartBarW {
		t.Errorf("last bar %+v", last)
	}
	if len(c.Bars[1].Segs) != 0 {
		t.Errorf("an empty minute has segments: %+v", c.Bars[1].Segs)
	}
}

// A message's receipts and lookups join its attempts in the order sendonce
// recorded them: the lookup after the ambiguous attempt it settles, the
// retry after it, a late receipt (its own clock earlier) at the time it
// came; the status now stays last.
func TestTimelineMergesEvidenceWithAttempts(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var v messageView
	v.Row.ID = uuid.New()
	v.Row.Status = outbox.StatusDelivered
	v.Row.CreatedAt, v.Row.UpdatedAt = at(0), at(40)
	v.Row.ToMasked = "+1*******67"
	// Out of time order on purpose: as read, attempts come before evidence.
	v.Attempts = []outbox.Attempt{
		{Number: 2, StartedAt: at(20), Outcome: "sent", HTTPStatus: 201},
		{Number: 1, StartedAt: at(1), Outcome: "lookup", Latency: 5 * time.Second},
	}
	v.Evidence = []outbox.Evidence{
		{Kind: "receipt", Result: "delivered", ProviderRef: "msg_2", ReportedAt: at(25), ReceivedAt: at(30), Source: "generic"},
		{Kind: "lookup", Result: "none", Detail: "lookup: the provider has no message for this reference", ReceivedAt: at(16), Source: "sender"},
		{Kind: "receipt", Result: "undelivered", Code: 30003, ReceivedAt: at(20), Source: "twilio"},
	}
	evs := timeline(v)
	var got []string
	for _, e := range evs {
		got = append(got, e.Kind+":"+e.Title)
	}
	want := []string{
		"created:created",
		"attempt:attempt 1: lookup",
		"lookup:lookup: none",
		"attempt:attempt 2: sent",
		"receipt:receipt: undelivered",
		"receipt:receipt: delivered",
		"status:now delivered",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if e := evs[5]; e.Result != "delivered" || !e.At.Equal(at(30)) ||
		!strings.Contains(e.Detail, "provider ref msg_2") || !strings.Contains(e.Detail, "reported at 2026-05-01 12:00:25Z") {
		t.Errorf("delivered receipt: %+v", e)
	}
	if e := evs[4]; !strings.Contains(e.Detail, "provider code 30003") || !strings.Contains(e.Detail, "(twilio)") {
		t.Errorf("undelivered receipt: %+v", e)
	}
	if e := evs[2]; e.Result != "none" || !strings.Contains(e.Detail, "asked by a sender") || !strings.Contains(e.Detail, "no message for this reference") {
		t.Errorf("lookup: %+v", e)
	}
	if v.Receipts() != 2 || v.Lookups() != 1 {
		t.Errorf("counted %d receipts and %d lookups", v.Receipts(), v.Lookups())
	}
}

func TestClientAddr(t *testing.T) {
	t.Parallel()
	proxies, err := ParseTrustedProxies("10.0.0.0/8, 192.0.2.1 ::ffff:172.16.0.0/108,2001:db8::/32")
	if err != nil {
		t.Fatal(err)
	}
	c := &Console{cfg: Config{TrustedProxies: proxies}}
	for _, tt := range []struct {
		peer, xff, want, key string
	}{
		{"203.0.113.5:4000", "198.51.100.1", "203.0.113.5", "203.0.113.5"},                    // not a proxy: the header is ignored
		{"10.1.1.1:4000", "", "10.1.1.1", "10.1.1.1"},                                         // a proxy without the header
		{"10.1.1.1:4000", "198.51.100.1", "198.51.100.1", "198.51.100.1"},                     // one proxy
		{"10.1.1.1:4000", "6.6.6.6, 198.51.100.1, 192.0.2.1", "198.51.100.1", "198.51.100.1"}, // two proxies; a forged left part
		{"[::ffff:10.1.1.1]:4000", "198.51.100.1", "198.51.100.1", "198.51.100.1"},            // a mapped peer
		{"172.16.3.3:4000", "::ffff:198.51.100.2", "198.51.100.2", "198.51.100.2"},            // a mapped prefix and client
		{"10.1.1.1:4000", "not-an-address, 10.2.2.2", "10.2.2.2", "10.2.2.2"},                 // the chain ends at garbage
		{"10.1.1.1:4000", "[2001:db9::1]:443", "2001:db9::1", "2001:db9::/64"},                // with a port; IPv6 keyed by /64
		{"[2001:db8::5]:4000", "2001:db9:1:2:3:4:5:6", "2001:db9:1:2:3:4:5:6", "2001:db9:1:2::/64"},
	} {
		r := &http.Request{RemoteAddr: tt.peer, Header: http.Header{}}
		if tt.xff != "" {
			r.Header.Set("X-Forwarded-For", tt.xff)
		}
		if got := c.remote(r); got != tt.want {
			t.Errorf("peer %s, X-Forwarded-For %q: client %s, want %s", tt.peer, tt.xff, got, tt.want)
		}
		if got := c.throttleKey(r); got != tt.key {
			t.Errorf("peer %s, X-Forwarded-For %q: key %s, want %s", tt.peer, tt.xff, got, tt.key)
		}
	}
	for _, bad := range []string{"proxy.example", "10.0.0.0/33", "10.0.0.1/8/1", "fe80::1%eth0"} {
		if _, err := ParseTrustedProxies(bad); err == nil {
			t.Errorf("ParseTrustedProxies(%q) accepted", bad)
		}
	}
}

// The throttle's table is bounded per address and overall, and forgets
// silent entries; flooding it evicts the least penalized entries, never
// a pair that waits longer than the newcomers.
func TestLimiterTablesAreBounded(t *testing.T) {
	t.Parallel()
	l := newLimiter()
	l.maxPerAddr, l.maxEntries, l.maxNames = 8, 50, 10
	now := time.Unix(1_000_000, 0)
	for range 12 {
		l.fail("alice", "a", true, now)
	}
	penalty := l.wait("alice", "a", now)
	if penalty < time.Minute {
		t.Fatalf("alice waits %s after 12 failures", penalty)
	}
	// One address, many names.
	for i := range 1000 {
		l.fail(fmt.Sprintf("user%d", i), "a", false, now)
	}
	if n := len(l.addrs["a"].names); n > l.maxPerAddr {
		t.Fatalf("address a holds %d pairs, cap %d", n, l.maxPerAddr)
	}
	if w := l.wait("alice", "a", now); w != penalty {
		t.Fatalf("after 1000 other names at a, alice waits %s there, want %s", w, penalty)
	}
	// Many addresses.
	for i := range 1000 {
		l.fail("mallory", fmt.Sprintf("b%d", i), false, now)
	}
	if addrs, pairs, names := l.size(); addrs+pairs > l.maxEntries || names > l.maxNames {
		t.Fatalf("%d addresses and %d pairs, cap %d; %d names, cap %d", addrs, pairs, l.maxEntries, names, l.maxNames)
	}
	// The names flooded past are evicted, fewest failures first: a user's
	// name never, and mallory's 1000 failures not.
	if l.names["alice"] == nil || l.names["mallory"] == nil || l.names["mallory"].fails != 1000 {
		t.Fatalf("the names' counts were evicted: alice %v, mallory %v", l.names["alice"], l.names["mallory"])
	}
	if w := l.wait("alice", "a", now); w != penalty {
		t.Fatalf("after 1000 other addresses, alice waits %s at a, want %s", w, penalty)
	}
	// An hour of silence later everything old is swept.
	later := now.Add(loginForget + loginSweepGap + time.Second)
	l.fail("bob", "c", true, later)
	if addrs, pairs, names := l.size(); addrs != 1 || pairs != 1 || names != 1 {
		t.Fatalf("after an hour: %d addresses, %d pairs, %d names; want only bob's", addrs, pairs, names)
	}
}

// The budget of password checks: a client's burst, then its rate; the
// console's, whichever client spends it; a wait that ends when both
// have a check again; one log-worthy refusal each time a bucket runs dry.
func TestBudget(t *testing.T) {
	t.Parallel()
	b := newBudget(0.5, 3, 1, 5)
	now := time.Unix(1_000_000, 0)
	take := func(client string, at time.Duration, want refusal, wantWait time.Duration) bool {
		t.Helper()
		w, why, first := b.take(client, now.Add(at))
		if why != want || w != wantWait {
			t.Fatalf("%s at +%s: refusal %d, wait %s; want %d, %s", client, at, why, w, want, wantWait)
		}
		return first
	}
	for range 3 {
		take("a", 0, allowed, 0)
	}
	if !take("a", 0, clientSpent, 2*time.Second) {
		t.Fatal("a's first refusal is not reported as the first")
	}
	if take("a", 0, clientSpent, 2*time.Second) {
		t.Fatal("a second refusal of the same dry bucket is reported as the first")
	}
	// The console holds 5: a took 3, b takes the other 2.
	take("b", 0, allowed, 0)
	take("b", 0, allowed, 0)
	if !take("c", 0, totalSpent, time.Second) {
		t.Fatal("the console's first refusal is not reported as the first")
	}
	// Both spent: the longer wait.
	take("a", 0, clientSpent, 2*time.Second)
	take("c", time.Second, allowed, 0)
	if take("d", time.Second, totalSpent, time.Second) != true {
		t.Fatal("the console's bucket ran dry again; its refusal is not reported")
	}
	take("a", 2*time.Second, allowed, 0)
}

// The budget keeps a client only while its bucket is below full, and
// makes one only for a check it allows: many addresses, each refused by
// the console's budget, leave nothing behind.
func TestBudgetTableIsBounded(t *testing.T) {
	t.Parallel()
	b := newBudget(0.5, 10, 5, 20)
	now := time.Unix(1_000_000, 0)
	for i := range 10_000 {
		b.take(fmt.Sprintf("10.0.%d.%d", i/256, i%256), now)
	}
	if n := b.size(); n != 20 {
		t.Fatalf("%d client buckets after 10,000 addresses at once; want the console's 20", n)
	}
	// 20 s later every bucket is full again; the next sweep drops them.
	later := now.Add(budgetSweepGap + time.Second)
	b.take("10.9.9.9", later)
	if n := b.size(); n != 1 {
		t.Fatalf("%d client buckets after the sweep; want 1", n)
	}
}
