package provider_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

const (
	stubAccount = "AC00000000000000000000000000000001"
	stubToken   = "stub-twilio-token"
	stubFrom    = "+15550001111"
)

// twilioStub starts the provider stub's Twilio facade behind a real HTTP
// listener; a message stays queued there for queueFor.
func twilioStub(t *testing.T, queueFor time.Duration) (*smsstub.Server, string) {
	t.Helper()
	s, err := smsstub.New(smsstub.Config{IgnoreKeys: true,
		Twilio: smsstub.Twilio{AccountSID: stubAccount, AuthToken: stubToken, QueueFor: queueFor}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	t.Cleanup(func() { _ = s.Close() })
	return s, ts.URL
}

// twilioClient is the Twilio adapter for base with lookups on.
func twilioClient(t *testing.T, base string, edit func(*provider.TwilioConfig)) *provider.Client {
	t.Helper()
	cfg := provider.TwilioConfig{BaseURL: base, AccountSID: stubAccount, AuthToken: stubToken, From: stubFrom,
		Lookup: true, Timeout: 10 * time.Second}
	if edit != nil {
		edit(&cfg)
	}
	c, err := provider.NewTwilio(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sendAll sends each body to testMsg.To and returns the sids.
func sendAll(t *testing.T, c *provider.Client, bodies ...string) []string {
	t.Helper()
	var sids []string
	for _, b := range bodies {
		o := c.Send(context.Background(), provider.Message{Key: uuid.NewString(), To: testMsg.To, Body: b})
		if o.Kind != provider.Sent {
			t.Fatalf("send: %+v", o)
		}
		sids = append(sids, o.Ref)
	}
	return sids
}

// A message Twilio still holds queued has no date_sent: a lookup that
// filters on DateSent does not see it, answers none, and the row is sent a
// second time. The lookup finds it, by its creation time.
func TestTwilioLookupFindsAQueuedMessage(t *testing.T) {
	t.Parallel()
	_, base := twilioStub(t, time.Hour)
	c := twilioClient(t, base, nil)
	since := time.Now().Add(-time.Second)
	sid := sendAll(t, c, testMsg.Body)[0]
	res := c.Lookup(context.Background(), provider.LookupQuery{Reference: testMsg.Key, To: testMsg.To, Body: testMsg.Body, Since: since})
	if res.Err != nil || len(res.Found) != 1 {
		t.Fatalf("lookup of a queued message: %+v, want it found", res)
	}
	if f := res.Found[0]; f.Ref != sid || f.Status != "accepted" || f.Created.Before(since.Add(-time.Second)) || f.Created.After(time.Now()) {
		t.Errorf("found %+v, want %s accepted, created just now", f, sid)
	}
}

// Twilio may store the text with other line breaks, another Unicode
// normalisation or without the white space at its ends; compared byte for
// byte, the lookup found nothing and the row was sent again.
func TestTwilioLookupMatchesTheTextTwilioStored(t *testing.T) {
	t.Parallel()
	_, base := twilioStub(t, time.Millisecond)
	c := twilioClient(t, base, nil)
	tests := []struct{ name, ours, stored string }{
		{"CRLF stored as LF", "Your code is 482901.\r\nIt expires in 10 minutes.", "Your code is 482901.\nIt expires in 10 minutes."},
		{"NFD stored as NFC", "Caf\u0065\u0301 ouvert: 482901", "Caf\u00e9 ouvert: 482901"},
		{"trailing newline trimmed", "Code 482901\n", "Code 482901"},
	}
	since := time.Now().Add(-time.Second)
	for _, tt := range tests {
		sid := sendAll(t, c, tt.stored)[0]
		res := c.Lookup(context.Background(), provider.LookupQuery{To: testMsg.To, Body: tt.ours, Since: since})
		if res.Err != nil || len(res.Found) != 1 || res.Found[0].Ref != sid {
			t.Errorf("%s: %+v, want %s found", tt.name, res, sid)
		}
	}
	if res := c.Lookup(context.Background(), provider.LookupQuery{To: testMsg.To, Body: "Code 482902", Since: since}); res.Err != nil || len(res.Found) != 0 {
		t.Errorf("another text: %+v, want none", res)
	}
}

// More messages to the number than the lookup may read: an error, never
// none (the row's message may be on a page it did not read). Within the
// cap every page is read, and the message on the last one found.
func TestTwilioLookupBeyondThePageCapFails(t *testing.T) {
	t.Parallel()
	// Queued all along: the list's order holds still while it is read.
	s, base := twilioStub(t, time.Hour)
	c := twilioClient(t, base, func(cfg *provider.TwilioConfig) { cfg.LookupPageSize, cfg.LookupPages = 5, 3 })
	since := time.Now().Add(-time.Second)
	ours := sendAll(t, c, testMsg.Body)[0]
	var others []string
	for i := range 14 {
		others = append(others, fmt.Sprintf("Another text %d", i))
	}
	sendAll(t, c, others...)
	// 15 messages, 3 pages of 5: ours, the oldest, is on the last.
	q := provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: since}
	res := c.Lookup(context.Background(), q)
	if res.Err != nil || len(res.Found) != 1 || res.Found[0].Ref != ours {
		t.Fatalf("15 messages in 3 pages of 5: %+v, want ours found", res)
	}
	before := s.Stats().Lookups
	sendAll(t, c, "one more")
	res = c.Lookup(context.Background(), q)
	if !errors.Is(res.Err, provider.ErrLookupIncomplete) || res.Found != nil {
		t.Fatalf("16 messages, 3 pages of 5 allowed: %+v, want ErrLookupIncomplete", res)
	}
	if n := s.Stats().Lookups - before; n != 3 {
		t.Errorf("the lookup read %d pages, want the 3 allowed", n)
	}
	if c := twilioClient(t, base, func(cfg *provider.TwilioConfig) { cfg.LookupPageSize, cfg.LookupPages = 5, 4 }); c.Lookup(context.Background(), q).Err != nil {
		t.Error("16 messages, 4 pages of 5 allowed: an error")
	}
	if strings.Contains(res.Err.Error(), "5551234567") || strings.Contains(res.Err.Error(), "482901") {
		t.Errorf("error %q holds the number or the text", res.Err)
	}
}

// Each page of a lookup has the client's timeout, not the lookup as a
// whole: a list of several slow pages is read whole; the caller's context
// (the sender's claim lease) bounds the lookup.
func TestTwilioLookupTimeoutIsPerPage(t *testing.T) {
	t.Parallel()
	s, err := smsstub.New(smsstub.Config{IgnoreKeys: true, Twilio: smsstub.Twilio{AccountSID: stubAccount, AuthToken: stubToken, QueueFor: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	// Every page of the list takes 400ms.
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			time.Sleep(400 * time.Millisecond)
		}
		s.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	c := twilioClient(t, ts.URL, func(cfg *provider.TwilioConfig) { cfg.LookupPageSize = 5 })
	since := time.Now().Add(-time.Second)
	ours := sendAll(t, c, testMsg.Body)[0]
	var others []string
	for i := range 14 {
		others = append(others, fmt.Sprintf("Another text %d", i))
	}
	sendAll(t, c, others...)
	slow := twilioClient(t, ts.URL, func(cfg *provider.TwilioConfig) { cfg.LookupPageSize, cfg.Timeout = 5, time.Second })
	q := provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: since}
	if res := slow.Lookup(context.Background(), q); res.Err != nil || len(res.Found) != 1 || res.Found[0].Ref != ours {
		t.Fatalf("3 pages of 400ms each with a 1s timeout: %+v, want ours found", res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if res := slow.Lookup(ctx, q); res.Err == nil {
		t.Fatalf("a lookup past its caller's deadline: %+v, want an error", res)
	}
}

// Through a messaging service Twilio picks the From from the service's
// pool: a lookup filtering on TWILIO_FROM saw none of the messages.
func TestTwilioLookupThroughAMessagingService(t *testing.T) {
	t.Parallel()
	_, base := twilioStub(t, 50*time.Millisecond)
	c := twilioClient(t, base, func(cfg *provider.TwilioConfig) { cfg.MessagingServiceSID = "MG0123" })
	since := time.Now().Add(-time.Second)
	sid := sendAll(t, c, testMsg.Body)[0]
	q := provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: since}
	if res := c.Lookup(context.Background(), q); res.Err != nil || len(res.Found) != 1 || res.Found[0].Ref != sid || res.Found[0].Status != "accepted" {
		t.Fatalf("accepted through a service: %+v, want it found", res)
	}
	testkit.WaitFor(t, 5*time.Second, "the message sent from the pool", func() bool {
		res := c.Lookup(context.Background(), q)
		return res.Err == nil && len(res.Found) == 1 && res.Found[0].Ref == sid
	})
}

// Messages created before the row (less the clock margin) are another
// row's, whatever their text.
func TestTwilioLookupIgnoresOlderMessages(t *testing.T) {
	t.Parallel()
	_, base := twilioStub(t, time.Millisecond)
	c := twilioClient(t, base, nil)
	sendAll(t, c, testMsg.Body)
	q := provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: time.Now().Add(provider.LookupMargin + time.Minute)}
	if res := c.Lookup(context.Background(), q); res.Err != nil || len(res.Found) != 0 {
		t.Fatalf("a message older than the row: %+v, want none", res)
	}
}

// twilioMessageJSON is one message of a hand-made Twilio list.
func twilioMessageJSON(sid, body, status string, created time.Time, sent bool) string {
	dateSent := "null"
	if sent {
		dateSent = `"` + created.Add(time.Second).UTC().Format(time.RFC1123Z) + `"`
	}
	return fmt.Sprintf(`{"sid":%q,"body":%q,"status":%q,"date_created":%q,"date_sent":%s,"to":"+15551234567","from":"+15550001111"}`,
		sid, body, status, created.UTC().Format(time.RFC1123Z), dateSent)
}

// Every status Twilio's document gives a message maps to what the lookup
// records, read from the document itself, so that a status it adds fails
// here until it is mapped. A message Twilio has taken (queued, sending,
// sent, accepted, scheduled, partially_delivered) is accepted; delivered and
// read are delivered; undelivered and failed (Twilio took it and could not
// send it: the receipt of the same message says the same) undelivered. A
// canceled message was never sent (Twilio cancels only a scheduled
// message, before sending), and receiving and received are inbound: none
// of them is a message sent for the row, so the lookup does not count it,
// and a row with nothing else is sent again (or ends dead) rather than
// read sent.
func TestTwilioLookupMapsEveryStatusOfTheDocument(t *testing.T) {
	t.Parallel()
	const notFound = ""
	want := map[string]string{
		"queued":              "accepted",
		"sending":             "accepted",
		"sent":                "accepted",
		"accepted":            "accepted",
		"scheduled":           "accepted",
		"partially_delivered": "accepted",
		"delivered":           "delivered",
		"read":                "delivered",
		"undelivered":         "undelivered",
		"failed":              "undelivered",
		"canceled":            notFound,
		"receiving":           notFound,
		"received":            notFound,
	}
	statuses := twilioListStatuses(t)
	for _, st := range statuses {
		if _, ok := want[st]; !ok {
			t.Errorf("the document's status %q has no mapping here", st)
		}
	}
	for st := range want {
		if !slices.Contains(statuses, st) {
			t.Errorf("status %q is mapped here but not in the document", st)
		}
	}
	now := time.Now()
	for _, st := range statuses {
		t.Run(st, func(t *testing.T) {
			t.Parallel()
			page := `{"messages":[` + twilioMessageJSON("SM1", testMsg.Body, st, now, false) + `],"next_page_uri":null}`
			p := startProvider(t, reply(200, page))
			res := twilioClient(t, p.URL, nil).Lookup(context.Background(),
				provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: now.Add(-time.Minute)})
			if res.Err != nil {
				t.Fatalf("lookup: %v", res.Err)
			}
			switch {
			case want[st] == notFound && len(res.Found) != 0:
				t.Errorf("a %s message: found %+v, want none (it was never sent for the row)", st, res.Found)
			case want[st] != notFound && (len(res.Found) != 1 || res.Found[0].Status != want[st] || res.Found[0].Ref != "SM1"):
				t.Errorf("a %s message: found %+v, want SM1 %s", st, res.Found, want[st])
			}
		})
	}
	// A status Twilio adds later is read with caution: Twilio has the
	// message, so it is never sent again.
	page := `{"messages":[` + twilioMessageJSON("SM1", testMsg.Body, "newly_invented", now, false) + `],"next_page_uri":null}`
	p := startProvider(t, reply(200, page))
	res := twilioClient(t, p.URL, nil).Lookup(context.Background(),
		provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: now.Add(-time.Minute)})
	if res.Err != nil || len(res.Found) != 1 || res.Found[0].Status != "accepted" {
		t.Errorf("a status the document does not know: %+v, want SM1 accepted", res)
	}
}

// A canceled message beside the one sent for the row after it: the one
// sent is found alone, and settles the row.
func TestTwilioLookupSkipsACanceledMessage(t *testing.T) {
	t.Parallel()
	now := time.Now()
	page := `{"messages":[` + twilioMessageJSON("SMnew", testMsg.Body, "queued", now, false) + `,` +
		twilioMessageJSON("SMold", testMsg.Body, "canceled", now.Add(-time.Second), false) + `],"next_page_uri":null}`
	p := startProvider(t, reply(200, page))
	res := twilioClient(t, p.URL, nil).Lookup(context.Background(),
		provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: now.Add(-time.Minute)})
	if res.Err != nil || len(res.Found) != 1 || res.Found[0].Ref != "SMnew" || res.Found[0].Status != "accepted" {
		t.Fatalf("lookup: %+v, want SMnew accepted alone", res)
	}
}

// Twilio sorts by date_sent: a message sent while the lookup pages moves
// from the unread end of the list to the first page, already read. The
// first page is read again at the end, and the message found there.
func TestTwilioLookupSeesAMessageThatMovedWhilePaging(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var mu sync.Mutex
	firstPages := 0
	page := func(msgs []string, next string) string {
		n := "null"
		if next != "" {
			n = fmt.Sprintf("%q", next)
		}
		return `{"messages":[` + strings.Join(msgs, ",") + `],"next_page_uri":` + n + `}`
	}
	other := twilioMessageJSON("SMother", "Another text", "delivered", now, true)
	ours := func(sent bool) string {
		status := map[bool]string{true: "sent", false: "queued"}[sent]
		return twilioMessageJSON("SMours", testMsg.Body, status, now, sent)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("Page") == "1" {
			// Ours was queued at the end when page 0 was read, and has
			// been sent since: it is no longer here.
			fmt.Fprint(w, page(nil, ""))
			return
		}
		firstPages++
		if firstPages == 1 {
			fmt.Fprint(w, page([]string{other}, r.URL.Path+"?To=x&PageSize=1&Page=1&PageToken=PASMother"))
			return
		}
		fmt.Fprint(w, page([]string{ours(true)}, r.URL.Path+"?To=x&PageSize=1&Page=1&PageToken=PASMours"))
	}))
	t.Cleanup(srv.Close)
	c := twilioClient(t, srv.URL, nil)
	res := c.Lookup(context.Background(), provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: now.Add(-time.Minute)})
	if res.Err != nil || len(res.Found) != 1 || res.Found[0].Ref != "SMours" {
		t.Fatalf("lookup: %+v, want SMours found on the first page read again", res)
	}
}

// What the lookup cannot read is an error, not none: an HTTP error, a next
// page outside the Messages resource, a message of ours whose creation time
// or sid is unreadable.
func TestTwilioLookupErrors(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ok := twilioMessageJSON("SM1", testMsg.Body, "sent", now, true)
	tests := []struct {
		name   string
		status int
		body   string
	}{
		{"server error", 500, `{"code":20500,"message":"Internal Server Error","status":500}`},
		{"not json", 200, `<html>`},
		{"next page elsewhere", 200, `{"messages":[],"next_page_uri":"/2010-04-01/Accounts/AC00000000000000000000000000000001/Calls.json?Page=1"}`},
		{"next page absolute", 200, `{"messages":[],"next_page_uri":"https://elsewhere.example.com/2010-04-01/Accounts/AC00000000000000000000000000000001/Messages.json?Page=1"}`},
		{"date_created unreadable", 200, `{"messages":[` + strings.Replace(ok, now.UTC().Format(time.RFC1123Z), "yesterday", 1) + `],"next_page_uri":null}`},
		{"sid unusable", 200, `{"messages":[` + strings.Replace(ok, `"SM1"`, `""`, 1) + `],"next_page_uri":null}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startProvider(t, reply(tt.status, tt.body))
			c := twilioClient(t, p.URL, nil)
			res := c.Lookup(context.Background(), provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: now.Add(-time.Minute)})
			if res.Err == nil || res.Found != nil {
				t.Fatalf("lookup: %+v, want an error", res)
			}
			if strings.Contains(res.Err.Error(), "5551234567") || strings.Contains(res.Err.Error(), "482901") {
				t.Errorf("error %q holds the number or the text", res.Err)
			}
		})
	}
	// A sound page for comparison: found, with its creation time.
	p := startProvider(t, reply(200, `{"messages":[`+ok+`],"next_page_uri":null}`))
	res := twilioClient(t, p.URL, nil).Lookup(context.Background(), provider.LookupQuery{To: testMsg.To, Body: testMsg.Body, Since: now.Add(-time.Minute)})
	if res.Err != nil || len(res.Found) != 1 || !res.Found[0].Created.Equal(now.Truncate(time.Second)) {
		t.Fatalf("a sound page: %+v", res)
	}
	reqs := p.requests()
	if len(reqs) != 1 || !strings.HasPrefix(reqs[0].Path, "/2010-04-01/Accounts/"+stubAccount+"/Messages.json") {
		t.Fatalf("requests %+v", reqs)
	}
}

// The Twilio adapter finds messages by their content, the generic one by
// our reference.
func TestLookupByContent(t *testing.T) {
	t.Parallel()
	if !twilioClient(t, "https://api.twilio.com", nil).LookupByContent() {
		t.Error("the Twilio adapter does not say it looks up by content")
	}
	if newClient(t, "https://sms.example.com", false, nil).LookupByContent() {
		t.Error("the generic client says it looks up by content")
	}
}
