package console_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/sendonce/sendonce/internal/console"
	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	operatorPassword = "operator password 1"
	viewerPassword   = "viewer password 22"
)

// users are an operator (alice) and a viewer (victor). Their hashes are of
// bcrypt's least cost, which a users file may not hold (ParseUsers refuses
// it) but which keeps logins fast under the race detector (a hash of
// MinCost takes over a second there).
var users = sync.OnceValue(func() []console.User {
	var out []console.User
	for _, u := range []struct {
		name, pw string
		role     console.Role
	}{{"alice", operatorPassword, console.RoleOperator}, {"victor", viewerPassword, console.RoleViewer}} {
		h, err := bcrypt.GenerateFromPassword([]byte(u.pw), bcrypt.MinCost)
		if err != nil {
			panic(err)
		}
		out = append(out, console.User{Name: u.name, Hash: h, Role: u.role})
	}
	return out
})

type fixture struct {
	t     testing.TB
	owner *pgxpool.Pool
	pool  *pgxpool.Pool // the console's, as sendonce_console
	js    jetstream.JetStream
	srv   *httptest.Server
	logs  *testkit.Buffer
	con   *console.Console
}

// setup serves a console on a fresh database, as the role
// sendonce_console, and an embedded NATS server.
func setup(t *testing.T) *fixture {
	t.Helper()
	return setupTB(t)
}

func setupTB(t testing.TB) *fixture {
	t.Helper()
	return setupWith(t, nil)
}

// setupWith is setup with a change to the console's configuration.
func setupWith(t testing.TB, change func(*console.Config)) *fixture {
	t.Helper()
	owner, dbURL := pgtest.NewPool(t)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, dbURL, "sendonce_console"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ns := natstest.Start(t)
	ns.EnsureTopology(t)
	_, js := ns.Connect(t)
	logs := &testkit.Buffer{}
	cfg := console.Config{Pool: pool, JetStream: js, Users: users(), Logger: slog.New(slog.NewJSONHandler(logs, nil))}
	if change != nil {
		change(&cfg)
	}
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	return &fixture{t: t, owner: owner, pool: pool, js: js, srv: srv, logs: logs, con: con}
}

// client does not follow redirects, so a test sees them.
func (f *fixture) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (f *fixture) do(c *http.Client, method, path string, form url.Values) (*http.Response, string) {
	f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, f.srv.URL+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	res, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return res, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// login logs in and returns the client and the session's CSRF token.
func (f *fixture) login(name, password string) (*http.Client, string) {
	f.t.Helper()
	c := f.client()
	res, _ := f.do(c, "POST", "/login", url.Values{"username": {name}, "password": {password}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" {
		f.t.Fatalf("login %s: %s, Location %q", name, res.Status, res.Header.Get("Location"))
	}
	_, page := f.do(c, "GET", "/", nil)
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		f.t.Fatal("no csrf field on the overview")
	}
	return c, m[1]
}

// deadRow makes a dead row with its dead letter stored, as a sender would.
func (f *fixture) deadRow() uuid.UUID {
	f.t.Helper()
	ctx := context.Background()
	id := uuid.New()
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, end_reason, attempt_count, last_error)
		VALUES ($1, '+15557654321', 'Your secret code is 771234', 'dead', 'permanent', 1, 'http 400: invalid To')`, id); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, latency_ms, outcome, http_status, provider_code, error)
		VALUES ($1, 1, now(), 20, 'permanent', 400, 21211, 'http 400: invalid To')`, id); err != nil {
		f.t.Fatal(err)
	}
	seq, err := deadletter.Publisher{JetStream: f.js}.Publish(ctx, deadletter.Letter{
		OutboxID: id, Reason: wire.ReasonPermanent, Error: "http 400: invalid To", Attempts: 1, ProviderCode: 21211,
		Payload: wire.AppendEncode(nil, wire.Send{ID: id}), Idempotency: deadletter.ProviderIdempotent})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.owner.Exec(ctx, `UPDATE sms_outbox SET letter_seq = $2 WHERE id = $1`, id, int64(seq)); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) status(id uuid.UUID) (string, int) {
	f.t.Helper()
	var s string
	var gen int
	if err := f.owner.QueryRow(context.Background(), `SELECT status, publish_gen FROM sms_outbox WHERE id = $1`, id).Scan(&s, &gen); err != nil {
		f.t.Fatal(err)
	}
	return s, gen
}

func (f *fixture) audits() int {
	f.t.Helper()
	var n int
	if err := f.owner.QueryRow(context.Background(), `SELECT count(*) FROM sendonce_console_audit`).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// Without a session a page sends the browser to the login form and
// anything else is refused; the assets need no session.
func TestUnauthenticatedRequestsAreRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.client()
	id := f.deadRow()
	for _, path := range []string{"/", "/dead-letters", "/messages/" + id.String(), "/messages?q=x", "/nowhere"} {
		res, _ := f.do(c, "GET", path, nil)
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/login" {
			t.Errorf("GET %s: %s to %q, want 303 to /login", path, res.Status, res.Header.Get("Location"))
		}
	}
	for _, path := range []string{"/dead-letters/replay", "/logout"} {
		res, _ := f.do(c, "POST", path, url.Values{"id": {id.String()}, "action": {"confirm"}, "csrf": {"guess"}})
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s: %s, want 401", path, res.Status)
		}
	}
	if s, _ := f.status(id); s != "dead" {
		t.Fatalf("row is %s after unauthenticated requests", s)
	}
	res, page := f.do(c, "GET", "/login", nil)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `name="username"`) || !strings.Contains(page, `name="password"`) {
		t.Fatalf("login page: %s", res.Status)
	}
	for _, asset := range []string{"/static/console.css", "/static/console.js"} {
		if res, _ := f.do(c, "GET", asset, nil); res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s", asset, res.Status)
		}
	}
}

func TestLogin(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.client()
	res, _ := f.do(c, "POST", "/login", url.Values{"username": {"alice"}, "password": {"wrong"}})
	if res.StatusCode != http.StatusUnauthorized || len(res.Cookies()) != 0 {
		t.Fatalf("wrong password: %s, cookies %v", res.Status, res.Cookies())
	}
	res, _ = f.do(c, "POST", "/login", url.Values{"username": {"alice"}, "password": {operatorPassword}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" {
		t.Fatalf("login: %s to %q", res.Status, res.Header.Get("Location"))
	}
	cookies := res.Cookies()
	if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Value == "" {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict", cookies)
	}
	if res, page := f.do(c, "GET", "/", nil); res.StatusCode != http.StatusOK || !strings.Contains(page, "alice") {
		t.Fatalf("overview after login: %s", res.Status)
	}

	// A login posted by another site's page is refused.
	req, _ := http.NewRequest("POST", f.srv.URL+"/login", strings.NewReader(url.Values{"username": {"alice"}, "password": {operatorPassword}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	res, err := f.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site login: %s, want 403", res.Status)
	}
	req, _ = http.NewRequest("POST", f.srv.URL+"/login", strings.NewReader(url.Values{"username": {"alice"}, "password": {operatorPassword}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Origin", "null")
	if res, err = f.client().Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site login (Sec-Fetch-Site): %s, want 403", res.Status)
	}

	// Guessing: after a few failures even the right password waits.
	for range 5 {
		f.do(f.client(), "POST", "/login", url.Values{"username": {"victor"}, "password": {"guess"}})
	}
	res, _ = f.do(f.client(), "POST", "/login", url.Values{"username": {"victor"}, "password": {viewerPassword}})
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("after 5 failures: %s, Retry-After %q; want 429", res.Status, res.Header.Get("Retry-After"))
	}
	if strings.Contains(f.logs.String(), viewerPassword) || strings.Contains(f.logs.String(), "guess") {
		t.Fatal("a password was logged")
	}

	// Logging out ends the session.
	_, page := f.do(c, "GET", "/", nil)
	csrf := csrfField.FindStringSubmatch(page)[1]
	if res, _ := f.do(c, "POST", "/logout", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %s", res.Status)
	}
	if res, _ := f.do(c, "GET", "/", nil); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("after logout: %s, want a redirect to the login", res.Status)
	}
}

// A state-changing request without the session's CSRF token is refused
// with 403 and changes nothing.
func TestRequestsWithoutCSRFAreRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.deadRow()
	c, csrf := f.login("alice", operatorPassword)
	for _, tt := range []struct {
		name string
		form url.Values
	}{
		{"missing", url.Values{"id": {id.String()}, "action": {"preview"}}},
		{"empty", url.Values{"id": {id.String()}, "action": {"confirm"}, "csrf": {""}}},
		{"wrong", url.Values{"id": {id.String()}, "action": {"confirm"}, "csrf": {csrf + "x"}}},
		{"another session's", url.Values{"id": {id.String()}, "action": {"confirm"}, "csrf": {func() string { _, s := f.login("alice", operatorPassword); return s }()}}},
	} {
		res, _ := f.do(c, "POST", "/dead-letters/replay", tt.form)
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("%s token: %s, want 403", tt.name, res.Status)
		}
	}
	if res, _ := f.do(c, "POST", "/logout", url.Values{}); res.StatusCode != http.StatusForbidden {
		t.Errorf("logout without a token: %s, want 403", res.Status)
	}
	if s, gen := f.status(id); s != "dead" || gen != 0 || f.audits() != 0 {
		t.Fatalf("row %s gen %d, %d audit records: something changed", s, gen, f.audits())
	}
	if res, _ := f.do(c, "GET", "/", nil); res.StatusCode != http.StatusOK {
		t.Fatalf("the session ended: %s", res.Status)
	}
}

// A viewer sees the dead letters but no replay controls, and its replay is
// refused even with a valid token.
func TestViewerCannotReplay(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.deadRow()
	c, csrf := f.login("victor", viewerPassword)
	_, page := f.do(c, "GET", "/dead-letters", nil)
	if !strings.Contains(page, `data-id="`+id.String()+`"`) {
		t.Fatal("the viewer does not see the dead letter")
	}
	if strings.Contains(page, `name="id"`) || strings.Contains(page, "replay-preview") {
		t.Fatal("the viewer sees replay controls")
	}
	for _, action := range []string{"preview", "confirm"} {
		res, _ := f.do(c, "POST", "/dead-letters/replay", url.Values{"id": {id.String()}, "action": {action}, "csrf": {csrf}})
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("viewer's %s: %s, want 403", action, res.Status)
		}
	}
	if s, _ := f.status(id); s != "dead" || f.audits() != 0 {
		t.Fatalf("row %s, %d audit records after a viewer's replay", s, f.audits())
	}
}

// An operator previews (nothing changes), confirms (the row goes back to
// pending, audited and logged), and a second confirmation of the same
// letter is refused.
func TestReplayPreviewThenConfirm(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id, other := f.deadRow(), f.deadRow()
	c, csrf := f.login("alice", operatorPassword)
	_, page := f.do(c, "GET", "/dead-letters?reason=permanent&since=1h", nil)
	for _, want := range []string{`data-id="` + id.String() + `"`, `name="id" value="` + id.String() + `"`, `data-action="replay-preview"`, `data-code="21211"`} {
		if !strings.Contains(page, want) {
			t.Errorf("dead letters page lacks %s", want)
		}
	}
	if _, page := f.do(c, "GET", "/dead-letters?reason=ambiguous", nil); strings.Contains(page, `data-id="`+id.String()+`"`) {
		t.Error("the reason filter keeps a permanent letter")
	}

	res, page := f.do(c, "POST", "/dead-letters/replay", url.Values{"id": {id.String()}, "action": {"preview"}, "csrf": {csrf}})
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `data-action="replay-confirm"`) {
		t.Fatalf("preview: %s\n%s", res.Status, page)
	}
	if s, _ := f.status(id); s != "dead" || f.audits() != 0 {
		t.Fatalf("the preview changed the row (%s) or wrote an audit record", s)
	}
	confirm := url.Values{"csrf": {csrf}, "action": {"confirm"}}
	for _, m := range regexp.MustCompile(`type="hidden" name="(id|letter)" value="([^"]+)"`).FindAllStringSubmatch(page, -1) {
		confirm.Add(m[1], m[2])
	}
	res, page = f.do(c, "POST", "/dead-letters/replay", confirm)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `data-field="replayed">1<`) {
		t.Fatalf("confirm: %s\n%s", res.Status, page)
	}
	if s, gen := f.status(id); s != "pending" || gen != 1 {
		t.Fatalf("after the replay the row is %s in generation %d, want pending in 1", s, gen)
	}
	if s, _ := f.status(other); s != "dead" {
		t.Fatalf("an unselected row was replayed: %s", s)
	}
	var who, role string
	var requested, replayed []uuid.UUID
	if err := f.owner.QueryRow(context.Background(), `SELECT username, role, requested, replayed FROM sendonce_console_audit`).
		Scan(&who, &role, &requested, &replayed); err != nil {
		t.Fatal(err)
	}
	if who != "alice" || role != "operator" || len(requested) != 1 || len(replayed) != 1 || replayed[0] != id {
		t.Fatalf("audit: %s %s %v %v", who, role, requested, replayed)
	}
	if logs := f.logs.String(); !strings.Contains(logs, `"msg":"console: replay"`) || !strings.Contains(logs, id.String()) {
		t.Fatalf("the replay is not logged:\n%s", logs)
	}

	// The same letter again: the row is no longer in the state it describes.
	res, page = f.do(c, "POST", "/dead-letters/replay", confirm)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `data-field="replayed">0<`) || !strings.Contains(page, "refused") {
		t.Fatalf("second confirm: %s\n%s", res.Status, page)
	}
	if s, gen := f.status(id); s != "pending" || gen != 1 {
		t.Fatalf("the second confirm changed the row: %s gen %d", s, gen)
	}

	// The message's page shows the replay, never the number or the body.
	_, page = f.do(c, "GET", "/messages/"+id.String(), nil)
	for _, want := range []string{`data-field="status">pending<`, `data-field="priority">2 (normal)<`, `data-event="replay"`, `data-event="letter"`, "&#43;1********21"} {
		if !strings.Contains(page, want) {
			t.Errorf("message page lacks %s", want)
		}
	}
	for _, secret := range []string{"5557654321", "771234", "Your secret code"} {
		if strings.Contains(page, secret) {
			t.Errorf("message page shows %q", secret)
		}
	}
}

// A row with evidence that the provider may have its message is refused
// by the console with that evidence named, in the preview and in a
// confirmation, which is audited as refused: the console never forces a
// replay (relay dlq replay -force is for after a look with relay trace).
func TestReplayRefusesRowsTheProviderMayHave(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	id := f.deadRow()
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_evidence (outbox_id, kind, result, source) VALUES ($1, 'receipt', 'delivered', 'twilio')`, id); err != nil {
		t.Fatal(err)
	}
	c, csrf := f.login("alice", operatorPassword)
	res, page := f.do(c, "POST", "/dead-letters/replay", url.Values{"id": {id.String()}, "action": {"preview"}, "csrf": {csrf}})
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `data-field="would-replay">0<`) ||
		!strings.Contains(page, "refused: the provider may have the message: a delivered receipt from twilio at ") ||
		strings.Contains(page, `data-action="replay-confirm"`) {
		t.Fatalf("preview: %s\n%s", res.Status, page)
	}
	var seq int64
	if err := f.owner.QueryRow(ctx, `SELECT letter_seq FROM sms_outbox WHERE id = $1`, id).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	res, page = f.do(c, "POST", "/dead-letters/replay", url.Values{"id": {id.String()}, "letter": {strconv.FormatInt(seq, 10)},
		"action": {"confirm"}, "csrf": {csrf}})
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `data-field="replayed">0<`) || !strings.Contains(page, "a replay may send it again") {
		t.Fatalf("confirm: %s\n%s", res.Status, page)
	}
	if s, gen := f.status(id); s != "dead" || gen != 0 {
		t.Fatalf("the row is %s in generation %d, want dead in 0", s, gen)
	}
	var replayed []uuid.UUID
	var refused int
	if err := f.owner.QueryRow(ctx, `SELECT replayed, refused FROM sendonce_console_audit`).Scan(&replayed, &refused); err != nil {
		t.Fatal(err)
	}
	if len(replayed) != 0 || refused != 1 {
		t.Fatalf("audit: replayed %v, refused %d; want none and 1", replayed, refused)
	}
}

func TestFindAMessage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.deadRow()
	if _, err := f.owner.Exec(context.Background(), `UPDATE sms_outbox SET provider_ref = 'msg_abc' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	c, _ := f.login("victor", viewerPassword)
	for _, q := range []string{id.String(), "msg_abc"} {
		res, _ := f.do(c, "GET", "/messages?q="+url.QueryEscape(q), nil)
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/messages/"+id.String() {
			t.Errorf("search %q: %s to %q", q, res.Status, res.Header.Get("Location"))
		}
	}
	if res, _ := f.do(c, "GET", "/messages?q=msg_none", nil); res.StatusCode != http.StatusNotFound {
		t.Errorf("search for nothing: %s", res.Status)
	}
	if res, _ := f.do(c, "GET", "/messages/"+uuid.NewString(), nil); res.StatusCode != http.StatusNotFound {
		t.Errorf("unknown id: %s", res.Status)
	}
}

// settledRow makes a row that a sender sent after a lookup found nothing
// and a receipt settled, changed age ago: its attempts, its lookup and its
// receipt, as the sender and the receiver record them.
func (f *fixture) settledRow(status string, age time.Duration) uuid.UUID {
	f.t.Helper()
	ctx := context.Background()
	id := uuid.New()
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count, provider_ref, created_at, updated_at)
		VALUES ($1, '+15557654321', 'Your secret code is 771234', $2, 2, 'msg_settled', now() - $3::interval - interval '1 minute', now() - $3::interval)`,
		id, status, age); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, latency_ms, outcome, http_status, error)
		VALUES ($1, 1, now() - $2::interval - interval '50 seconds', 5000, 'lookup', 0, 'read timeout after the request was written'),
		       ($1, 2, now() - $2::interval - interval '30 seconds', 40, 'sent', 201, NULL)`, id, age); err != nil {
		f.t.Fatal(err)
	}
	code := map[string]any{"delivered": nil, "undelivered": 30003}[status]
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, code, detail, reported_at, received_at, source)
		VALUES ($1, 'lookup', 'none', NULL, NULL, 'lookup: the provider has no message for this reference', NULL, now() - $2::interval - interval '40 seconds', 'sender'),
		       ($1, 'receipt', $3, 'msg_settled', $4, NULL, now() - $2::interval - interval '1 second', now() - $2::interval, 'generic')`,
		id, age, status, code); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// A message's page shows its receipts and lookups, in the timeline's time
// order among its attempts, inside [data-section=receipts]; never the
// number or the body.
func TestMessageTimelineShowsReceiptsAndLookups(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.settledRow("undelivered", time.Minute)
	c, _ := f.login("victor", viewerPassword)
	res, page := f.do(c, "GET", "/messages/"+id.String(), nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("message page: %s", res.Status)
	}
	section := regexp.MustCompile(`(?s)<section[^>]*data-section="receipts"[^>]*>(.*?)</section>`).FindStringSubmatch(page)
	if section == nil {
		t.Fatalf("no [data-section=receipts] on the page:\n%s", page)
	}
	if !strings.Contains(section[0], `data-receipts="1"`) || !strings.Contains(section[0], `data-lookups="1"`) {
		t.Errorf("the section does not count 1 receipt and 1 lookup: %.200s", section[0])
	}
	var events []string
	for _, m := range regexp.MustCompile(`<li data-event="([a-z]+)"(?: data-result="([a-z]+)")?>`).FindAllStringSubmatch(section[1], -1) {
		events = append(events, strings.TrimSuffix(m[1]+":"+m[2], ":"))
	}
	want := "created attempt lookup:none attempt receipt:undelivered status"
	if strings.Join(events, " ") != want {
		t.Errorf("timeline %v, want %s", events, want)
	}
	for _, s := range []string{"provider code 30003", "msg_settled", "no message for this reference", `data-field="status">undelivered<`} {
		if !strings.Contains(page, s) {
			t.Errorf("the page does not show %q", s)
		}
	}
	if strings.Contains(page, "7654321") || strings.Contains(page, "771234") {
		t.Error("the message page shows the number or the body")
	}
	// A message nothing has reported on yet says so.
	res, page = f.do(c, "GET", "/messages/"+f.deadRow().String(), nil)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `data-receipts="0" data-lookups="0"`) {
		t.Errorf("a message without evidence: %s", res.Status)
	}
}

// A sent row whose receipt is overdue shows that its fate is being asked
// for, and when next; a queued row's pending lookup keeps its own text.
func TestMessageShowsAnOverdueReceipt(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	overdue, queued := uuid.New(), uuid.New()
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count, provider_ref, lookup_pending, lookups, next_attempt_at, updated_at)
		VALUES ($1, '+15557654321', 'Your code is 1', 'sent', 1, 'msg_overdue', true, 1, now() + interval '1 hour', now() - interval '2 hours'),
		       ($2, '+15557654321', 'Your code is 2', 'queued', 1, NULL, true, 2, now(), now())`, overdue, queued); err != nil {
		t.Fatal(err)
	}
	c, _ := f.login("victor", viewerPassword)
	for id, want := range map[uuid.UUID]string{
		overdue: "receipt overdue: the provider is asked for the message's fate, next at",
		queued:  "due: the provider is asked about the last attempt before anything else is sent (2 failed so far)",
	} {
		res, page := f.do(c, "GET", "/messages/"+id.String(), nil)
		if res.StatusCode != http.StatusOK || !strings.Contains(page, want) {
			t.Errorf("message %s: %s; the page does not say %q", id, res.Status, want)
		}
	}
}

// The overview counts delivered and undelivered rows of the last hour and
// the last 24 hours: a row counts from the receipt that settled it.
func TestOverviewCountsDeliveredAndUndelivered(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, r := range []struct {
		status string
		age    time.Duration
	}{{"delivered", time.Minute}, {"delivered", 2 * time.Minute}, {"delivered", 3 * time.Hour},
		{"undelivered", 10 * time.Minute}, {"undelivered", 5 * time.Hour}, {"undelivered", 30 * time.Hour}} {
		f.settledRow(r.status, r.age)
	}
	c, _ := f.login("victor", viewerPassword)
	_, page := f.do(c, "GET", "/", nil)
	for hook, want := range map[string]string{
		`data-hour="delivered"`: "2", `data-day="delivered"`: "3", `data-status="delivered"`: "3",
		`data-hour="undelivered"`: "1", `data-day="undelivered"`: "2", `data-status="undelivered"`: "3",
	} {
		m := regexp.MustCompile(`<span ` + regexp.QuoteMeta(hook) + `[^>]*>([^<]*)<`).FindStringSubmatch(page)
		if m == nil || m[1] != want {
			t.Errorf("%s shows %v, want %s", hook, m, want)
		}
	}
}
