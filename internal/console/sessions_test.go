package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sendonce/sendonce/internal/console"
)

// loggedIn reports whether c's session is live.
func (f *fixture) loggedIn(c *http.Client) bool {
	f.t.Helper()
	res, _ := f.do(c, "GET", "/", nil)
	return res.StatusCode == http.StatusOK
}

// A viewer logging in again and again, up to the console's whole session
// store, evicts its own sessions, never an operator's. (Its 30 logins in
// a row from one address are over the default budget of password
// checks, raised here.)
func TestAViewersLoginsDoNotEvictAnOperator(t *testing.T) {
	t.Parallel()
	f := setupWith(t, func(c *console.Config) { c.MaxSessions, c.LoginBurst, c.LoginTotalBurst = 5, 100, 100 })
	alice, _ := f.login("alice", operatorPassword)
	var victor []*http.Client
	for range 30 {
		c, _ := f.login("victor", viewerPassword)
		victor = append(victor, c)
	}
	if !f.loggedIn(alice) {
		t.Fatal("30 logins of a viewer logged the operator out")
	}
	if f.loggedIn(victor[0]) || !f.loggedIn(victor[len(victor)-1]) {
		t.Fatal("the viewer's oldest session lives or its newest does not")
	}
}

// A user's login past MaxSessionsPerUser ends that user's oldest session;
// a login past MaxSessions ends the oldest of the user holding the most.
func TestSessionsAreCappedPerUserAndInAll(t *testing.T) {
	t.Parallel()
	f := setupWith(t, func(c *console.Config) { c.MaxSessions, c.MaxSessionsPerUser = 5, 3 })
	var victor []*http.Client
	for range 4 {
		c, _ := f.login("victor", viewerPassword)
		victor = append(victor, c)
	}
	if all, v := f.con.Sessions("victor"); all != 3 || v != 3 {
		t.Fatalf("after victor's 4 logins: %d sessions, %d of victor's; want 3", all, v)
	}
	if f.loggedIn(victor[0]) || !f.loggedIn(victor[1]) {
		t.Fatal("victor's fourth login did not end his oldest session")
	}
	var alice []*http.Client
	for range 3 {
		c, _ := f.login("alice", operatorPassword)
		alice = append(alice, c)
	}
	// The third makes six: victor, who holds the most, loses his oldest.
	if all, v := f.con.Sessions("victor"); all != 5 || v != 2 {
		t.Fatalf("after alice's 3 logins: %d sessions, %d of victor's; want 5 and 2", all, v)
	}
	for i, c := range alice {
		if !f.loggedIn(c) {
			t.Errorf("alice's session %d ended", i)
		}
	}
	if f.loggedIn(victor[1]) || !f.loggedIn(victor[2]) || !f.loggedIn(victor[3]) {
		t.Error("the store's cap did not end victor's oldest session, or ended another")
	}
	a4, _ := f.login("alice", operatorPassword)
	if f.loggedIn(alice[0]) || !f.loggedIn(a4) || !f.loggedIn(victor[2]) {
		t.Error("alice's fourth login did not end her own oldest session")
	}
	if all, a := f.con.Sessions("alice"); all != 5 || a != 3 {
		t.Fatalf("at the end: %d sessions, %d of alice's; want 5 and 3", all, a)
	}
}

// A user ends every other session of theirs with a POST carrying the
// session's CSRF token (403 without it); it is logged, and nobody else's
// session ends.
func TestLogOutOtherSessions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	laptop, _ := f.login("alice", operatorPassword)
	phone, csrf := f.login("alice", operatorPassword)
	stolen, _ := f.login("alice", operatorPassword)
	victor, _ := f.login("victor", viewerPassword)
	_, page := f.do(phone, "GET", "/", nil)
	if !strings.Contains(page, `action="/logout/others"`) || !strings.Contains(page, `data-action="logout-others"`) {
		t.Fatal("the page has no button to log out other sessions")
	}
	for _, form := range []url.Values{{}, {"csrf": {csrf + "x"}}} {
		if res, _ := f.do(phone, "POST", "/logout/others", form); res.StatusCode != http.StatusForbidden {
			t.Fatalf("without the token: %s, want 403", res.Status)
		}
	}
	if !f.loggedIn(laptop) || !f.loggedIn(stolen) {
		t.Fatal("a refused request ended sessions")
	}
	res, _ := f.do(phone, "POST", "/logout/others", url.Values{"csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("log out other sessions: %s, want 303", res.Status)
	}
	if f.loggedIn(laptop) || f.loggedIn(stolen) {
		t.Fatal("another session of alice's lives on")
	}
	if !f.loggedIn(phone) || !f.loggedIn(victor) {
		t.Fatal("the session that asked, or another user's, ended")
	}
	if all, a := f.con.Sessions("alice"); all != 2 || a != 1 {
		t.Fatalf("%d sessions, %d of alice's; want 2 and 1", all, a)
	}
	if logs := f.logs.String(); !strings.Contains(logs, `"msg":"console: other sessions logged out","component":"console","user":"alice","ended":2`) {
		t.Fatalf("not logged:\n%s", logs)
	}
}
