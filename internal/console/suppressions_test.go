package console_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// wholeNumber matches a phone number written out on a page.
var wholeNumber = regexp.MustCompile(`\+[0-9]{7,}`)

// An operator adds a number to the suppression list and removes it, each
// change with a CSRF token, a reason, and an audit row the database writes
// with it; a viewer checks a number and sees the list, masked, but may not
// change it (403, nothing changed); a change without the token is refused.
// No page shows a number whole.
func TestSuppressionsPage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const number = "+15550004321"
	alice, token := f.login("alice", operatorPassword)
	victor, vtoken := f.login("victor", viewerPassword)
	listed := func() (bool, string) {
		t.Helper()
		var n int
		var by string
		err := f.owner.QueryRow(context.Background(), `SELECT count(*), coalesce(max(added_by), '') FROM sms_suppressions WHERE number = $1`, number).Scan(&n, &by)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1, by
	}
	page := func(c *http.Client, method, path string, form url.Values) (int, string) {
		t.Helper()
		res, body := f.do(c, method, path, form)
		body = html.UnescapeString(body)
		if m := wholeNumber.FindString(body); m != "" {
			t.Errorf("%s %s shows a number whole (%s)", method, path, m)
		}
		return res.StatusCode, body
	}

	if code, body := page(victor, "POST", "/suppressions/add", url.Values{"csrf": {vtoken}, "number": {number}, "reason": {"x"}}); code != http.StatusForbidden {
		t.Errorf("a viewer's addition: %d\n%s", code, body)
	}
	if code, _ := page(alice, "POST", "/suppressions/add", url.Values{"number": {number}, "reason": {"x"}}); code != http.StatusForbidden {
		t.Errorf("an addition without a CSRF token: %d", code)
	}
	if code, body := page(alice, "POST", "/suppressions/add", url.Values{"csrf": {token}, "number": {"5550004321"}, "reason": {"x"}}); code != http.StatusBadRequest ||
		strings.Contains(body, "5550004321") {
		t.Errorf("a bad number: %d, or it is repeated", code)
	}
	if code, _ := page(alice, "POST", "/suppressions/remove", url.Values{"csrf": {token}, "number": {number}}); code != http.StatusBadRequest {
		t.Errorf("a removal without a reason: %d", code)
	}
	if ok, _ := listed(); ok || f.audits() != 0 {
		t.Fatalf("refused changes changed the list (%v) or the audit (%d rows)", ok, f.audits())
	}

	code, body := page(alice, "POST", "/suppressions/add", url.Values{"csrf": {token}, "number": {number}, "reason": {"asked by email"}})
	if code != http.StatusOK || !strings.Contains(body, `data-field="done"`) || !strings.Contains(body, "+1********21") {
		t.Fatalf("addition: %d\n%s", code, body)
	}
	if ok, by := listed(); !ok || by != "alice" {
		t.Fatalf("after the addition: listed %v by %q", ok, by)
	}
	code, body = page(victor, "GET", "/suppressions", nil)
	if code != http.StatusOK || !strings.Contains(body, `data-suppression="1"`) || !strings.Contains(body, "asked by email") ||
		strings.Contains(body, `data-action="suppress-add"`) || strings.Contains(body, `data-action="suppress-remove"`) {
		t.Errorf("the viewer's list: %d\n%s", code, body)
	}
	code, body = page(victor, "POST", "/suppressions/check", url.Values{"csrf": {vtoken}, "number": {number}})
	if code != http.StatusOK || !strings.Contains(body, `data-listed="true"`) || !strings.Contains(body, "operator asked by email (by alice)") {
		t.Errorf("the viewer's check: %d\n%s", code, body)
	}
	if code, body := page(victor, "POST", "/suppressions/remove", url.Values{"csrf": {vtoken}, "number": {number}, "reason": {"x"}}); code != http.StatusForbidden {
		t.Errorf("a viewer's removal: %d\n%s", code, body)
	}
	code, body = page(alice, "POST", "/suppressions/remove", url.Values{"csrf": {token}, "number": {number}, "reason": {"resubscribed by phone"}})
	if code != http.StatusOK || !strings.Contains(body, "removed from the list") || !strings.Contains(body, "resubscribed by phone") {
		t.Errorf("removal: %d\n%s", code, body)
	}
	if ok, _ := listed(); ok {
		t.Error("the number is still listed after its removal")
	}
	var audits, masked int
	if err := f.owner.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE detail LIKE '+1********21: %' AND username = 'alice')
		FROM sendonce_console_audit WHERE action IN ('suppress', 'unsuppress')`).Scan(&audits, &masked); err != nil || audits != 2 || masked != 2 {
		t.Errorf("%d audit rows (%d by alice, number masked), %v; want 2", audits, masked, err)
	}
	if _, body := page(alice, "GET", "/suppressions", nil); !strings.Contains(body, "resubscribed by phone") || strings.Count(body, "data-audit=") != 2 {
		t.Errorf("the page's recent changes:\n%s", body)
	}
	// The console's own role may not change the list, nor write its audit
	// rows, but through its function.
	for _, stmt := range []string{`DELETE FROM sms_suppressions`, `INSERT INTO sendonce_console_audit (username, role, action, requested, replayed, refused) VALUES ('x', 'operator', 'suppress', '{}', '{}', 0)`,
		`SELECT sendonce_suppress_add('{+15550004322}', 'operator', 'x', 'mallory')`} {
		if _, err := f.pool.Exec(context.Background(), stmt); err == nil {
			t.Errorf("the console's role ran %q", stmt)
		}
	}
	if strings.Contains(f.logs.String(), number) {
		t.Error("the console logged a number")
	}
}

// A message whose number is on the list says so, and from what source; so
// does one the claim suppressed after its number left the list.
func TestMessageShowsItsSuppression(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	id := f.deadRow()
	if _, err := f.owner.Exec(ctx, `SELECT sendonce_suppress_inbound('+15557654321', 'telnyx', 'STOP', false)`); err != nil {
		t.Fatal(err)
	}
	alice, _ := f.login("alice", operatorPassword)
	_, body := f.do(alice, "GET", "/messages/"+id.String(), nil)
	if !strings.Contains(body, `data-field="suppression">the number is on the suppression list: inbound telnyx STOP, since `) {
		t.Errorf("the message page does not show the number's suppression:\n%s", body)
	}
}
