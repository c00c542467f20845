package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/provider"
)

const sinchBatchID = "01FC66621VHDBN119Z8PMV1QPQ"

func TestSinchRequestShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		receipts string
		from     string
		want     map[string]any
	}{
		{name: "no receipts", from: "+15550001111", want: map[string]any{
			"to": []any{"+15551234567"}, "from": "+15550001111", "body": testMsg.Body, "client_reference": testMsg.Key}},
		{name: "receipts", receipts: "https://receipts.example.com/", from: "Acme", want: map[string]any{
			"to": []any{"+15551234567"}, "from": "Acme", "body": testMsg.Body, "client_reference": testMsg.Key,
			"delivery_report": "per_recipient", "callback_url": "https://receipts.example.com/v1/receipts/sinch"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startProvider(t, reply(201, `{"id":"`+sinchBatchID+`","to":["15551234567"],"canceled":false}`))
			c, err := provider.NewSinch(provider.SinchConfig{BaseURL: p.URL + "/", ServicePlanID: "plan 1", APIToken: "s3cret-token", From: tt.from, ReceiptsURL: tt.receipts})
			if err != nil {
				t.Fatal(err)
			}
			if c.Idempotent() || c.CanLookup() {
				t.Errorf("the Sinch client claims idempotency (%v) or lookups (%v)", c.Idempotent(), c.CanLookup())
			}
			o := send(t, c)
			if o.Kind != provider.Sent || o.Ref != sinchBatchID || o.HTTPStatus != 201 {
				t.Errorf("outcome %+v, want Sent with the batch id as Ref", o)
			}
			reqs := p.requests()
			if len(reqs) != 1 {
				t.Fatalf("server got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.Method != http.MethodPost || r.Path != "/xms/v1/plan 1/batches" {
				t.Errorf("request %s %s, want POST /xms/v1/plan 1/batches", r.Method, r.Path)
			}
			if r.Auth != "Bearer s3cret-token" {
				t.Errorf("Authorization = %q", r.Auth)
			}
			if r.ContentType != "application/json" || r.Key != "" {
				t.Errorf("Content-Type %q, Idempotency-Key %q", r.ContentType, r.Key)
			}
			var body map[string]any
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(body)
			want, _ := json.Marshal(tt.want)
			if string(got) != string(want) {
				t.Errorf("body %s, want %s", got, want)
			}
		})
	}
}

func TestSinchClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		body   string
		header []string
		want   provider.Kind
		maybe  bool
		after  time.Duration
		reason string
	}{
		{name: "created", status: 201, body: `{"id":"` + sinchBatchID + `"}`, want: provider.Sent},
		{name: "bad parameter echoing the number", status: 400, body: `{"code":"syntax_invalid_parameter_format","text":"The format of parameter 'to[0]' is invalid; value '+15551234567' is not a valid MSISDN or group ID."}`, want: provider.Permanent, reason: "syntax_invalid_parameter_format"},
		{name: "forbidden", status: 403, body: `{"code":"missing_callback_url","text":"Requesting delivery report without any callback URL."}`, want: provider.Permanent, reason: "missing_callback_url: Requesting"},
		{name: "bad token", status: 401, body: ``, want: provider.Permanent},
		{name: "rate limited", status: 429, body: `{"code":"too_many_requests","text":"Too many requests"}`, header: []string{"Retry-After", "3"}, want: provider.Retry, after: 3 * time.Second},
		{name: "internal error", status: 500, body: `{"code":"internal_error","text":"Internal error"}`, want: provider.Ambiguous, maybe: true},
		{name: "unavailable", status: 503, body: ``, want: provider.Ambiguous},
		{name: "proxy timeout", status: 408, body: ``, want: provider.Ambiguous, maybe: true},
		{name: "conflict", status: 409, body: ``, want: provider.Ambiguous, maybe: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startProvider(t, reply(tt.status, tt.body, tt.header...))
			c, err := provider.NewSinch(provider.SinchConfig{BaseURL: p.URL, ServicePlanID: "plan1", APIToken: "s3cret-token", From: "Acme", Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			o := send(t, c)
			if o.Kind != tt.want || o.Code != 0 || o.HTTPStatus != tt.status || o.MaybeAccepted != tt.maybe || o.After != tt.after {
				t.Errorf("outcome %+v, want %v maybe-accepted %v after %s", o, tt.want, tt.maybe, tt.after)
			}
			if !strings.HasPrefix(o.Reason, tt.reason) {
				t.Errorf("reason %q, want it to start with %q", o.Reason, tt.reason)
			}
			if n := len(p.requests()); n != 1 {
				t.Errorf("server got %d requests, want 1", n)
			}
			assertNoSecrets(t, o)
			if strings.Contains(o.Reason, "s3cret") {
				t.Errorf("reason %q holds the token", o.Reason)
			}
		})
	}
}

// A number that is not E.164 digits is refused before anything is sent,
// and the refusal does not hold it.
func TestSinchRefusesMalformedNumbers(t *testing.T) {
	t.Parallel()
	p := startProvider(t, reply(201, `{"id":"b1"}`))
	c, err := provider.NewSinch(provider.SinchConfig{BaseURL: p.URL, ServicePlanID: "plan1", APIToken: "tok", From: "Acme"})
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"+1555", "+0015551234567", "+1555123456789012", "+1 555 123 4567", "15551234567x"} {
		o := c.Send(context.Background(), provider.Message{Key: testMsg.Key, To: to, Body: testMsg.Body})
		if o.Kind != provider.Permanent || strings.Contains(o.Reason, strings.TrimPrefix(to, "+")) {
			t.Errorf("to %q: outcome %+v, want Permanent without the number", to, o)
		}
	}
	if n := len(p.requests()); n != 0 {
		t.Errorf("server got %d requests, want none", n)
	}
}

func TestNewSinchValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  provider.SinchConfig
		want string
	}{
		{"valid", provider.SinchConfig{ServicePlanID: "p", APIToken: "s3cret", From: "Acme"}, ""},
		{"no plan", provider.SinchConfig{APIToken: "s3cret", From: "Acme"}, "ServicePlanID"},
		{"plan with a path", provider.SinchConfig{ServicePlanID: "p/../x", APIToken: "s3cret", From: "Acme"}, "ServicePlanID"},
		{"no token", provider.SinchConfig{ServicePlanID: "p", From: "Acme"}, "APIToken"},
		{"no sender", provider.SinchConfig{ServicePlanID: "p", APIToken: "s3cret"}, "From"},
		{"page too large", provider.SinchConfig{ServicePlanID: "p", APIToken: "s3cret", From: "Acme", LookupPageSize: 101}, "LookupPageSize"},
		{"bad base URL", provider.SinchConfig{BaseURL: "us.sms.api.sinch.com", ServicePlanID: "p", APIToken: "s3cret", From: "Acme"}, "BaseURL"},
	}
	for _, tt := range tests {
		_, err := provider.NewSinch(tt.cfg)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: NewSinch: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: NewSinch error = %v, want one naming %s", tt.name, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %q holds the token", tt.name, err)
		}
	}
}

// SMS_PROVIDER=sinch and sinch in SMS_PROVIDERS: its settings are
// required, SINCH_API_BASE is its base in failover mode, and lookups are
// on with SMS_API_LOOKUP but not past Sinch's 14 days.
func TestSinchSettings(t *testing.T) {
	t.Parallel()
	base := map[string]string{"SMS_PROVIDER": "sinch", "SINCH_SERVICE_PLAN_ID": "plan1", "SINCH_API_TOKEN": "s3cret", "SINCH_FROM": "Acme"}
	tests := []struct {
		name   string
		edit   map[string]string
		want   string
		lookup bool
	}{
		{name: "valid"},
		{name: "lookup", edit: map[string]string{"SMS_API_LOOKUP": "true"}, lookup: true},
		{name: "no plan", edit: map[string]string{"SINCH_SERVICE_PLAN_ID": ""}, want: "SINCH_SERVICE_PLAN_ID"},
		{name: "no token", edit: map[string]string{"SINCH_API_TOKEN": ""}, want: "SINCH_API_TOKEN"},
		{name: "no sender", edit: map[string]string{"SINCH_FROM": ""}, want: "SINCH_FROM"},
		{name: "failover names it", edit: map[string]string{"SMS_PROVIDERS": "sinch", "SINCH_FROM": ""}, want: "sinch in SMS_PROVIDERS"},
		{name: "retention past the list", edit: map[string]string{"SMS_API_LOOKUP": "true", "SMS_API_LOOKUP_RETENTION": "360h"}, want: "SMS_API_LOOKUP_RETENTION"},
		{name: "insecure base", edit: map[string]string{"SINCH_API_BASE": "http://127.0.0.1:1"}, want: "SINCH_API_BASE"},
	}
	for _, tt := range tests {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range tt.edit {
			env[k] = v
		}
		var c provider.Settings
		var stderr strings.Builder
		s := envflag.New("test", func(k string) string { return env[k] }, &stderr)
		provider.BindSettings(s, &c)
		err := s.Parse(nil)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
			continue
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: error = %v, want one naming %s", tt.name, err, tt.want)
			continue
		case tt.want != "":
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: error holds the token", tt.name)
			}
			continue
		}
		cl, err := c.Client(4)
		if err != nil {
			t.Fatalf("%s: Client: %v", tt.name, err)
		}
		if cl.Idempotent() || cl.CanLookup() != tt.lookup || c.LooksUp() != tt.lookup || cl.LookupByContent() {
			t.Errorf("%s: idempotent %v, can look up %v, looks up %v; want lookups %v by reference", tt.name, cl.Idempotent(), cl.CanLookup(), c.LooksUp(), tt.lookup)
		}
	}

	// In failover mode SINCH_API_BASE is Sinch's base, not SMS_API_BASE.
	p := startProvider(t, reply(201, `{"id":"`+sinchBatchID+`"}`))
	env := map[string]string{"SMS_PROVIDERS": "sinch,vonage", "SINCH_SERVICE_PLAN_ID": "plan1", "SINCH_API_TOKEN": "tok", "SINCH_FROM": "Acme",
		"SINCH_API_BASE": p.URL, "SMS_API_BASE": "http://127.0.0.1:1", "SMS_API_ALLOW_INSECURE": "true",
		"VONAGE_API_KEY": "k", "VONAGE_API_SECRET": "s", "VONAGE_FROM": "Acme"}
	var c provider.Settings
	s := envflag.New("test", func(k string) string { return env[k] }, &strings.Builder{})
	provider.BindSettings(s, &c)
	if err := s.Parse(nil); err != nil {
		t.Fatal(err)
	}
	named, err := c.Clients(2)
	if err != nil || len(named) != 2 || named[0].Name != "sinch" {
		t.Fatalf("Clients: %v %+v", err, named)
	}
	if o := send(t, named[0].Client); o.Kind != provider.Sent || len(p.requests()) != 1 {
		t.Errorf("the sinch client of the failover list did not send to SINCH_API_BASE: %+v", o)
	}
}

// sinchList serves ListBatches from batches, page by page, as Sinch does:
// {"page","page_size","count","batches"}; it records each query.
type sinchList struct {
	mu      sync.Mutex
	batches []map[string]any
	queries []url.Values
	// count, when set, replaces the list's count (a list that changes).
	count func() int
}

func (l *sinchList) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	l.mu.Lock()
	l.queries = append(l.queries, q)
	all := l.batches
	count := len(all)
	if l.count != nil {
		count = l.count()
	}
	l.mu.Unlock()
	page, _ := strconv.Atoi(q.Get("page"))
	size, _ := strconv.Atoi(q.Get("page_size"))
	lo, hi := min(page*size, len(all)), min((page+1)*size, len(all))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"page": page, "page_size": hi - lo, "count": count, "batches": all[lo:hi]})
}

func (l *sinchList) seen() []url.Values {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]url.Values(nil), l.queries...)
}

func sinchBatch(id, ref string) map[string]any {
	return map[string]any{"id": id, "to": []string{"15551234567"}, "from": "Acme", "body": "x",
		"client_reference": ref, "created_at": "2026-08-01T10:00:00.000Z", "canceled": false}
}

func sinchLookupClient(t *testing.T, l *sinchList, pageSize, pages int) *provider.Client {
	t.Helper()
	p := startProvider(t, l.serve)
	c, err := provider.NewSinch(provider.SinchConfig{BaseURL: p.URL, ServicePlanID: "plan1", APIToken: "tok", From: "Acme",
		Lookup: true, LookupPageSize: pageSize, LookupPages: pages, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSinchLookup(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC)
	others := func(n int) []map[string]any {
		var out []map[string]any
		for i := range n {
			out = append(out, sinchBatch(fmt.Sprintf("OTHER%03d", i), fmt.Sprintf("ref-%d", i)))
		}
		return out
	}
	canceled := sinchBatch("B2", testMsg.Key)
	canceled["canceled"] = true
	tests := []struct {
		name    string
		batches []map[string]any
		want    []provider.Found
		pages   int
	}{
		{name: "none", batches: others(7), pages: 3},
		{name: "empty list", batches: nil, pages: 1},
		{name: "found on the last page", batches: append(others(6), sinchBatch("B1", testMsg.Key)), pages: 3,
			want: []provider.Found{{Ref: "B1", Status: "accepted", Created: time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC)}}},
		{name: "canceled", batches: append(others(2), canceled), pages: 1,
			want: []provider.Found{{Ref: "B2", Status: "undelivered", Created: time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC)}}},
		{name: "several", batches: append(append(others(2), sinchBatch("B1", testMsg.Key)), sinchBatch("B3", testMsg.Key)), pages: 2,
			want: []provider.Found{{Ref: "B1", Status: "accepted", Created: time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC)}, {Ref: "B3", Status: "accepted", Created: time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := &sinchList{batches: tt.batches}
			c := sinchLookupClient(t, l, 3, 5)
			if !c.CanLookup() || c.LookupByContent() {
				t.Fatal("the Sinch client with Lookup cannot look up by reference")
			}
			r := c.Lookup(context.Background(), provider.LookupQuery{Reference: testMsg.Key, To: testMsg.To, Body: testMsg.Body, Since: since})
			if r.Err != nil {
				t.Fatalf("lookup: %v", r.Err)
			}
			got, _ := json.Marshal(r.Found)
			want, _ := json.Marshal(tt.want)
			if string(got) != string(want) {
				t.Errorf("found %s, want %s", got, want)
			}
			qs := l.seen()
			if len(qs) != tt.pages {
				t.Errorf("read %d pages, want %d", len(qs), tt.pages)
			}
			for i, q := range qs {
				if q.Get("from") != "Acme" || q.Get("page") != strconv.Itoa(i) || q.Get("page_size") != "3" || q.Get("start_date") != "2026-08-01T09:59:00Z" {
					t.Errorf("page %d asked with %v", i, q)
				}
			}
		})
	}
}

// A list that could not be read whole is an error, never "none".
func TestSinchLookupIncomplete(t *testing.T) {
	t.Parallel()
	var many []map[string]any
	for i := range 10 {
		many = append(many, sinchBatch(fmt.Sprintf("B%d", i), fmt.Sprintf("ref-%d", i)))
	}
	noID := sinchBatch("", testMsg.Key)
	tests := []struct {
		name string
		l    *sinchList
	}{
		{"more pages than allowed", &sinchList{batches: many}},
		{"the list ends before its count", &sinchList{batches: many[:4], count: func() int { return 9 }}},
		{"ours without an id", &sinchList{batches: []map[string]any{noID}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := sinchLookupClient(t, tt.l, 2, 3)
			r := c.Lookup(context.Background(), provider.LookupQuery{Reference: testMsg.Key, Since: time.Now()})
			if !errors.Is(r.Err, provider.ErrLookupIncomplete) || r.Found != nil {
				t.Errorf("lookup = %+v, want ErrLookupIncomplete", r)
			}
		})
	}
	for _, ans := range []struct {
		status int
		body   string
	}{{500, `{}`}, {200, `not json`}, {200, `{"page":0,"page_size":0,"batches":[]}`}, {401, ``}} {
		p := startProvider(t, reply(ans.status, ans.body))
		c, err := provider.NewSinch(provider.SinchConfig{BaseURL: p.URL, ServicePlanID: "plan1", APIToken: "s3cret-token", From: "Acme", Lookup: true})
		if err != nil {
			t.Fatal(err)
		}
		r := c.Lookup(context.Background(), provider.LookupQuery{Reference: testMsg.Key, Since: time.Now()})
		if r.Err == nil || r.Found != nil || strings.Contains(r.Err.Error(), "s3cret") {
			t.Errorf("answer %d %s: lookup = %+v, want an error without the token", ans.status, ans.body, r)
		}
	}
}
