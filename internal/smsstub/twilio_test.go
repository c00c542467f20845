package smsstub

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

const (
	testAccount = "AC0123456789abcdef0123456789abcdef"
	testToken   = "twilio-stub-token-sekret"
	testFrom    = "+15550001111"
)

var twilioSID = regexp.MustCompile(`^SM[0-9a-f]{32}$`)

// newTwilioStub starts a stub with its Twilio facade for testAccount.
func newTwilioStub(t *testing.T, cfg Config) *testStub {
	t.Helper()
	cfg.IgnoreKeys = true
	cfg.Twilio.AccountSID, cfg.Twilio.AuthToken = testAccount, testToken
	return newStub(t, cfg)
}

// adapter is the sender's real Twilio adapter pointed at s.
func adapter(t *testing.T, s *testStub, edit func(*provider.TwilioConfig)) *provider.Client {
	t.Helper()
	cfg := provider.TwilioConfig{BaseURL: s.url, AccountSID: testAccount, AuthToken: testToken, From: testFrom,
		Timeout: 5 * time.Second, ReceiptsURL: "http://127.0.0.1:1"}
	if edit != nil {
		edit(&cfg)
	}
	c, err := provider.NewTwilio(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// twilioGet GETs path (and query) from the facade with the account's
// credentials, or with user and pass when given.
func twilioGet(t *testing.T, s *testStub, path string, cred ...string) (int, twilioPage, twilioError) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.url+path, nil)
	user, pass := testAccount, testToken
	if len(cred) == 2 {
		user, pass = cred[0], cred[1]
	}
	req.SetBasicAuth(user, pass)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var page twilioPage
	var e twilioError
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &page); err != nil {
			t.Fatalf("list answer %s: %v", raw, err)
		}
	} else if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("error answer %s: %v", raw, err)
	}
	return resp.StatusCode, page, e
}

const listPath = "/2010-04-01/Accounts/" + testAccount + "/Messages.json"

// The sender's real Twilio adapter against the facade: a message is
// created (a sid, counted under its row's key), a second request for the
// same row is a second delivery (Twilio is never idempotent), and Twilio's
// errors and the stub's faults are classified as the adapter's tests
// expect of Twilio, with no number, body or credential in an outcome or a
// log line.
func TestTwilioFacadeWithTheAdapter(t *testing.T) {
	t.Parallel()
	var logs testkit.Buffer
	s := newTwilioStub(t, Config{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	c := adapter(t, s, nil)
	ctx := context.Background()
	m := provider.Message{Key: uuid.NewString(), To: testTo, Body: testText}

	o := c.Send(ctx, m)
	if o.Kind != provider.Sent || !twilioSID.MatchString(o.Ref) || o.HTTPStatus != 201 {
		t.Fatalf("first send: %+v, want Sent with a Twilio sid", o)
	}
	if o2 := c.Send(ctx, m); o2.Kind != provider.Sent || o2.Ref == o.Ref {
		t.Fatalf("second send: %+v, want another message", o2)
	}
	if d := s.Deliveries()[m.Key]; d.Deliveries != 2 || d.Requests != 2 || d.To != testTo {
		t.Fatalf("deliveries of the row's key: %+v, want 2 (a double send the stub must show)", d)
	}
	if got := s.Messages(m.Key); len(got) != 2 || got[0] != "queued" {
		t.Fatalf("messages of the row: %v", got)
	}

	// Through a messaging service: accepted, and no From sent.
	svc := adapter(t, s, func(cfg *provider.TwilioConfig) { cfg.MessagingServiceSID = "MG0123" })
	if o := svc.Send(ctx, provider.Message{Key: uuid.NewString(), To: testTo, Body: testText}); o.Kind != provider.Sent {
		t.Fatalf("send through a service: %+v", o)
	}

	tests := []struct {
		name   string
		faults Faults
		client *provider.Client
		msg    provider.Message
		kind   provider.Kind
		status int
		code   int
	}{
		{name: "invalid To echoed by Twilio", client: c, msg: provider.Message{Key: "k1", To: "+1555123456789012", Body: testText},
			kind: provider.Permanent, status: 400, code: CodeInvalidTo},
		{name: "wrong token", client: adapter(t, s, func(cfg *provider.TwilioConfig) { cfg.AuthToken = "wrong" }),
			msg: m, kind: provider.Permanent, status: 401, code: CodeAuthFailed},
		{name: "server error", faults: Faults{FailRate: 1, FailStatus: 500}, client: c, msg: m,
			kind: provider.Ambiguous, status: 500, code: 20500},
		{name: "unsubscribed", faults: Faults{FailRate: 1, FailStatus: 400, FailCode: 21610}, client: c, msg: m,
			kind: provider.Permanent, status: 400, code: 21610},
		{name: "rate limited", faults: Faults{RateLimitRate: 1, RetryAfter: 2 * time.Second}, client: c, msg: m,
			kind: provider.Retry, status: 429, code: CodeRateLimited},
	}
	for _, tt := range tests {
		if err := s.SetFaults(tt.faults); err != nil {
			t.Fatal(err)
		}
		o := tt.client.Send(ctx, tt.msg)
		if o.Kind != tt.kind || o.HTTPStatus != tt.status || o.Code != tt.code {
			t.Errorf("%s: %+v, want %v %d code %d", tt.name, o, tt.kind, tt.status, tt.code)
		}
		if strings.Contains(o.Reason, "555123456") || strings.Contains(o.Reason, "482901") || strings.Contains(o.Reason, testToken) {
			t.Errorf("%s: outcome %q holds the number, the body or the token", tt.name, o.Reason)
		}
		if tt.kind == provider.Retry && o.After != 2*time.Second {
			t.Errorf("%s: Retry-After %v, want 2s", tt.name, o.After)
		}
	}

	// Accepted, then the answer withheld: the adapter cannot tell, and the
	// stub counts the delivery under the row's key.
	if err := s.SetFaults(Faults{WithholdRate: 1, WithholdMode: WithholdClose}); err != nil {
		t.Fatal(err)
	}
	lost := provider.Message{Key: uuid.NewString(), To: testTo, Body: testText}
	if o := c.Send(ctx, lost); o.Kind != provider.Ambiguous || !o.MaybeAccepted {
		t.Errorf("withheld answer: %+v, want Ambiguous", o)
	}
	if d := s.Deliveries()[lost.Key]; d.Deliveries != 1 {
		t.Errorf("withheld answer: %+v, want the delivery counted", d)
	}
	// Latency holds the answer back.
	if err := s.SetFaults(Faults{Latency: 150 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if o := c.Send(ctx, m); o.Kind != provider.Sent || o.Latency < 150*time.Millisecond {
		t.Errorf("with latency: %+v", o)
	}

	out := logs.String()
	for _, secret := range []string{"5551234567", testText, testToken} {
		if strings.Contains(out, secret) {
			t.Errorf("log holds %q:\n%s", secret, out)
		}
	}
}

// The list: Twilio's credentials and account; To, From and DateSent
// filters, a message not sent yet passing no DateSent filter; pages of
// PageSize followed through next_page_uri, the sent messages newest first
// and the queued ones after them.
func TestTwilioFacadeList(t *testing.T) {
	t.Parallel()
	s := newTwilioStub(t, Config{Twilio: Twilio{QueueFor: 300 * time.Millisecond}})
	c := adapter(t, s, nil)
	ctx := context.Background()
	send := func(to, body string) string {
		t.Helper()
		o := c.Send(ctx, provider.Message{Key: uuid.NewString(), To: to, Body: body})
		if o.Kind != provider.Sent {
			t.Fatalf("send: %+v", o)
		}
		return o.Ref
	}
	var sent []string
	for i := range 3 {
		sent = append(sent, send(testTo, "sent "+string(rune('a'+i))))
		time.Sleep(5 * time.Millisecond) // distinct creation times
	}
	other := send("+15557654321", "to another number")
	testkit.WaitFor(t, 5*time.Second, "the first messages sent", func() bool {
		_, p, _ := twilioGet(t, s, listPath+"?DateSent>="+time.Now().UTC().Format(time.DateOnly))
		return len(p.Messages) == 4
	})
	queued := []string{send(testTo, "queued a"), send(testTo, "queued b")}

	today := time.Now().UTC().Format(time.DateOnly)
	q := url.Values{"To": {testTo}, "From": {testFrom}, "PageSize": {"2"}}
	var got []twilioMessage
	next := listPath + "?" + q.Encode()
	for pages := 0; next != ""; pages++ {
		if pages > 5 {
			t.Fatal("more pages than messages")
		}
		code, p, e := twilioGet(t, s, next)
		if code != 200 || p.PageSize != 2 || len(p.Messages) > 2 {
			t.Fatalf("page %d: %d %+v %+v", pages, code, p, e)
		}
		got = append(got, p.Messages...)
		next = ""
		if p.NextPageURI != nil {
			next = *p.NextPageURI
		}
	}
	want := []string{sent[2], sent[1], sent[0], queued[1], queued[0]}
	if len(got) != len(want) {
		t.Fatalf("%d messages listed, want %d", len(got), len(want))
	}
	for i, m := range got {
		if m.SID != want[i] {
			t.Errorf("message %d is %s, want %s (sent newest first, then the queued)", i, m.SID, want[i])
		}
		if _, err := time.Parse(time.RFC1123Z, m.DateCreated); err != nil {
			t.Errorf("date_created %q: %v", m.DateCreated, err)
		}
		if i < 3 && (m.DateSent == nil || m.Status != "sent") || i >= 3 && (m.DateSent != nil || m.Status != "queued") {
			t.Errorf("message %d: status %s, date_sent %v", i, m.Status, m.DateSent)
		}
		if m.To != testTo || m.From == nil || *m.From != testFrom || m.AccountSID != testAccount {
			t.Errorf("message %d: %+v", i, m)
		}
	}
	for _, f := range []string{"DateSent=" + today, "DateSent>=" + today, "DateSent<=" + today} {
		if _, p, _ := twilioGet(t, s, listPath+"?To=%2B15551234567&"+f); len(p.Messages) != 3 {
			t.Errorf("%s: %d messages, want the 3 sent (the queued have no date_sent)", f, len(p.Messages))
		}
	}
	yesterday := time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	if _, p, _ := twilioGet(t, s, listPath+"?DateSent<="+yesterday); len(p.Messages) != 0 {
		t.Errorf("DateSent<=yesterday: %d messages", len(p.Messages))
	}
	if _, p, _ := twilioGet(t, s, listPath+"?To=%2B15557654321"); len(p.Messages) != 1 || p.Messages[0].SID != other {
		t.Errorf("To another number: %+v", p.Messages)
	}
	if code, _, e := twilioGet(t, s, listPath, testAccount, "wrong"); code != 401 || e.Code != CodeAuthFailed || e.Status != 401 {
		t.Errorf("wrong token: %d %+v", code, e)
	}
	if code, _, e := twilioGet(t, s, "/2010-04-01/Accounts/ACother/Messages.json"); code != 404 || e.Code != CodeTwilioNotFound {
		t.Errorf("another account: %d %+v", code, e)
	}
	if code, _, e := twilioGet(t, s, listPath+"?PageSize=1001"); code != 400 || e.Code != CodeTwilioInvalid {
		t.Errorf("PageSize 1001: %d %+v", code, e)
	}
	if err := s.SetFaults(Faults{LookupFailRate: 1}); err != nil {
		t.Fatal(err)
	}
	if code, _, e := twilioGet(t, s, listPath); code != 500 || e.Code != 20500 || !strings.Contains(e.MoreInfo, "20500") {
		t.Errorf("injected lookup failure: %d %+v", code, e)
	}
}

// A message sent through a messaging service is accepted without a From;
// once sent it shows the pool's number, not one the sender named.
func TestTwilioFacadeMessagingService(t *testing.T) {
	t.Parallel()
	s := newTwilioStub(t, Config{Twilio: Twilio{QueueFor: 100 * time.Millisecond}})
	c := adapter(t, s, func(cfg *provider.TwilioConfig) { cfg.MessagingServiceSID = "MG0123" })
	o := c.Send(context.Background(), provider.Message{Key: uuid.NewString(), To: testTo, Body: testText})
	if o.Kind != provider.Sent {
		t.Fatalf("send: %+v", o)
	}
	_, p, _ := twilioGet(t, s, listPath)
	if m := p.Messages[0]; m.Status != "accepted" || m.From != nil || m.ServiceSID == nil || *m.ServiceSID != "MG0123" {
		t.Fatalf("just after: %+v", m)
	}
	testkit.WaitFor(t, 5*time.Second, "the message sent", func() bool {
		_, p, _ := twilioGet(t, s, listPath)
		return p.Messages[0].Status == "sent"
	})
	if _, p, _ := twilioGet(t, s, listPath); p.Messages[0].From == nil || *p.Messages[0].From != TwilioPoolNumber {
		t.Fatalf("sent: from %v, want the pool's number", p.Messages[0].From)
	}
}

// Status callbacks, signed by the facade with X-Twilio-Signature, reach
// the project's receiver and are taken (acting as its least-privilege role,
// on a real database): each row is reported sent with its sid when the
// message leaves the queue, then delivered or undelivered (with a
// duplicate, and an older "sent" after it, which change nothing).
func TestTwilioCallbacksReachTheReceiver(t *testing.T) {
	t.Parallel()
	admin, dsn := pgtest.NewPool(t)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, dsn, "sendonce_receiver"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reg := prometheus.NewRegistry()
	// The receiver's public URL is its listener's: what the stub calls.
	srv := httptest.NewUnstartedServer(nil)
	public := "http://" + srv.Listener.Addr().String()
	rv, err := receiver.New(receiver.Config{Pool: pool, TwilioToken: testToken, Registerer: reg,
		Logger: slog.New(slog.DiscardHandler), PublicURL: public})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = rv.Handler()
	srv.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rv.Run(ctx) }()
	t.Cleanup(func() { srv.Close(); cancel(); <-done })

	s := newTwilioStub(t, Config{Twilio: Twilio{QueueFor: 50 * time.Millisecond},
		Receipts: Receipts{Delay: 100 * time.Millisecond, DuplicateRate: 1, ReorderRate: 1, UndeliveredSuffixes: []string{"0013"}}})
	c := adapter(t, s, func(cfg *provider.TwilioConfig) { cfg.ReceiptsURL = public })
	rows := map[uuid.UUID]string{uuid.New(): "+15550000001", uuid.New(): "+15550000013"}
	sids := map[uuid.UUID]string{}
	for id, to := range rows {
		if _, err := admin.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count)
			VALUES ($1, $2, $3, 'sending', 1)`, id, to, testText); err != nil {
			t.Fatal(err)
		}
		o := c.Send(context.Background(), provider.Message{Key: id.String(), To: to, Body: testText})
		if o.Kind != provider.Sent {
			t.Fatalf("send: %+v", o)
		}
		sids[id] = o.Ref
	}
	status := func(id uuid.UUID) (string, string) {
		var st string
		var ref *string
		if err := admin.QueryRow(context.Background(), `SELECT status, provider_ref FROM sms_outbox WHERE id = $1`, id).Scan(&st, &ref); err != nil {
			t.Fatal(err)
		}
		if ref == nil {
			return st, ""
		}
		return st, *ref
	}
	testkit.WaitFor(t, 20*time.Second, "both callbacks' fates acknowledged", func() bool {
		d := s.Deliveries()
		for id := range rows {
			if !d[id.String()].ReceiptAcked {
				return false
			}
		}
		return true
	})
	for id, to := range rows {
		want := "delivered"
		if strings.HasSuffix(to, "0013") {
			want = "undelivered"
		}
		if st, ref := status(id); st != want || ref != sids[id] {
			t.Errorf("row %s: %s %q, want %s with sid %s", to, st, ref, want, sids[id])
		}
	}
	// Per row: sent, the fate twice, sent again; none refused.
	testkit.WaitFor(t, 10*time.Second, "every callback answered", func() bool { return s.Stats().ReceiptsSent == 8 })
	if st := s.Stats(); st.ReceiptFailures != 0 {
		t.Errorf("stats %+v: callbacks refused by the receiver", st)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "forged" && m.GetCounter().GetValue() > 0 {
					t.Errorf("the receiver counted %v forged callbacks", m.GetCounter().GetValue())
				}
			}
		}
	}
}

// BenchmarkTwilioList is one page of one number's messages, the request a
// lookup repeats, in an account that took n messages to 20 numbers (the
// soak's -provider twilio at 5,000 rows, and at its default 100,000 with
// as many per number).
func BenchmarkTwilioList(b *testing.B) {
	for _, n := range []int{5_000, 100_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			s, err := New(Config{IgnoreKeys: true, Twilio: Twilio{AccountSID: testAccount, AuthToken: testToken}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			numbers := n / 250
			now := time.Now()
			s.mu.Lock()
			for i := range n {
				msg := messageRequest{To: fmt.Sprintf("+1555%07d", i%numbers), From: testFrom, Body: fmt.Sprintf("message %d", i)}
				m := s.newMessage(shapeTwilio, shapeTwilio.newID(), msg, now.Add(time.Duration(i-n)*time.Millisecond))
				m.fate, m.fateAt = "delivered", m.sentAt
				s.twilioMsgs = append(s.twilioMsgs, m)
			}
			s.mu.Unlock()
			q := url.Values{"To": {fmt.Sprintf("+1555%07d", 7)}, "From": {testFrom}, "PageSize": {"100"}}
			req := httptest.NewRequest(http.MethodGet, listPath+"?"+q.Encode(), nil)
			req.SetBasicAuth(testAccount, testToken)
			h := s.Handler()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("list: %d %s", w.Code, w.Body)
				}
			}
		})
	}
}
