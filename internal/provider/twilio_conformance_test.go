package provider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

// twilioSpec is Twilio's published OpenAPI document of its API v2010
// (testdata/twilio/README.md says where it comes from).
const twilioSpec = "testdata/twilio/twilio_api_v2010.json"

// twilioMessages is the document's path of the Messages resource, which the
// adapter creates messages at (CreateMessage) and lists them from
// (ListMessage).
const twilioMessages = "/2010-04-01/Accounts/{AccountSid}/Messages.json"

// twilioAccount matches the document's AccountSid pattern; it is the
// account of its examples, so that the example page's next_page_uri is a
// page of the same list to the adapter.
const twilioAccount = "ACaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// twilioService matches the document's MessagingServiceSid pattern.
const twilioService = "MG0123456789abcdef0123456789abcdef"

// twilioOperation is what the tests read of one operation of the document.
type twilioOperation struct {
	OperationID string `json:"operationId"`
	Parameters  []struct {
		Name string `json:"name"`
		In   string `json:"in"`
	} `json:"parameters"`
	RequestBody struct {
		Content map[string]struct {
			Schema struct {
				Required   []string                   `json:"required"`
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schema"`
		} `json:"content"`
	} `json:"requestBody"`
	Responses map[string]struct {
		Content map[string]struct {
			Examples map[string]struct {
				Value json.RawMessage `json:"value"`
			} `json:"examples"`
		} `json:"content"`
	} `json:"responses"`
}

// twilioDoc is the document's server URL and its Messages operations.
type twilioDoc struct {
	server       *url.URL
	create, list twilioOperation
}

func readTwilioSpec(t *testing.T) twilioDoc {
	t.Helper()
	raw, err := os.ReadFile(twilioSpec)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Servers []struct {
			URL string `json:"url"`
		} `json:"servers"`
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	path, ok := doc.Paths[twilioMessages]
	if !ok || len(doc.Servers) == 0 {
		t.Fatalf("the document has no %s, or no server", twilioMessages)
	}
	var d twilioDoc
	if d.server, err = url.Parse(doc.Servers[0].URL); err != nil {
		t.Fatal(err)
	}
	for method, op := range map[string]*twilioOperation{"post": &d.create, "get": &d.list} {
		if err := json.Unmarshal(path[method], op); err != nil {
			t.Fatalf("%s %s: %v", method, twilioMessages, err)
		}
	}
	if d.create.OperationID != "CreateMessage" || d.list.OperationID != "ListMessage" {
		t.Fatalf("operations %q and %q, want CreateMessage and ListMessage", d.create.OperationID, d.list.OperationID)
	}
	return d
}

// twilioListStatuses are the values the document allows a message's
// status in ListMessage's answer: the enum of the status of the schema its
// messages refer to (message_enum_status, as the document now has it),
// followed through the document's $refs.
func twilioListStatuses(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(twilioSpec)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	// at walks keys from node, following a "$ref" wherever it meets one.
	var at func(node any, keys ...string) any
	at = func(node any, keys ...string) any {
		for {
			m, ok := node.(map[string]any)
			if !ok {
				t.Fatalf("the document has no object where %v continues", keys)
			}
			if ref, ok := m["$ref"].(string); ok {
				node = doc
				for _, k := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
					node = node.(map[string]any)[k]
				}
				continue
			}
			if len(keys) == 0 {
				return m
			}
			node, keys = m[keys[0]], keys[1:]
		}
	}
	schema := at(doc, "paths", twilioMessages, "get", "responses", "200", "content", "application/json", "schema",
		"properties", "messages", "items", "properties", "status").(map[string]any)
	var out []string
	for _, v := range schema["enum"].([]any) {
		out = append(out, v.(string))
	}
	if len(out) == 0 {
		t.Fatal("the document lists no message status")
	}
	return out
}

// formFields are the form fields CreateMessage defines.
func (d twilioDoc) formFields() map[string]bool {
	out := map[string]bool{}
	for name := range d.create.RequestBody.Content["application/x-www-form-urlencoded"].Schema.Properties {
		out[name] = true
	}
	return out
}

// queryParams are the query parameters ListMessage defines.
func (d twilioDoc) queryParams() map[string]bool {
	out := map[string]bool{}
	for _, p := range d.list.Parameters {
		if p.In == "query" {
			out[p.Name] = true
		}
	}
	return out
}

// example is the value of one of an operation's examples of its answer.
func (op twilioOperation) example(t *testing.T, status, name string) []byte {
	t.Helper()
	ex, ok := op.Responses[status].Content["application/json"].Examples[name]
	if !ok {
		t.Fatalf("%s has no example %q of its %s", op.OperationID, name, status)
	}
	return ex.Value
}

// undefined are the names of vs that defined lacks, sorted. Prism does not
// refuse a form field or query parameter the document does not name, so
// the tests check the names with it.
func undefined(vs url.Values, defined map[string]bool) []string {
	var out []string
	for name := range vs {
		if !defined[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// The document is the one testdata/twilio/README.md names, unchanged.
func TestTwilioSpecIsThePublishedOne(t *testing.T) {
	t.Parallel()
	publishedSpec(t, twilioSpec)
}

// The adapter's default base URL is the document's server, and it creates
// messages at the document's path.
func TestTwilioDefaultBaseIsTheDocumentsServer(t *testing.T) {
	t.Parallel()
	d := readTwilioSpec(t)
	var got *url.URL
	c, err := provider.NewTwilio(provider.TwilioConfig{AccountSID: twilioAccount, AuthToken: "tok", From: "+15550001111",
		Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
			got = r.URL
			return nil, errors.New("not sent")
		})})
	if err != nil {
		t.Fatal(err)
	}
	_ = send(t, c)
	want := d.server.String() + strings.Replace(twilioMessages, "{AccountSid}", twilioAccount, 1)
	if got == nil || got.String() != want {
		t.Errorf("the adapter POSTs to %v, the document's server and path make %s", got, want)
	}
}

// TestTwilioConformsToPublishedSpec points the Twilio adapter at Prism
// serving Twilio's own OpenAPI document, over real HTTP: every message it
// creates (from a number, from an alphanumeric sender, through a messaging
// service; with and without a status callback) is a valid CreateMessage
// (no request violation, the document's 201, whose example sid it takes),
// with only form fields the document defines.
func TestTwilioConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	d := readTwilioSpec(t)
	var created struct {
		SID string `json:"sid"`
	}
	if err := json.Unmarshal(d.create.example(t, "201", "create"), &created); err != nil || created.SID == "" {
		t.Fatalf("the document's create example has no sid: %v", err)
	}
	base, _, exchanges := startPrism(t, twilioSpec, "")
	msgs := []provider.Message{
		testMsg,
		{Key: "7d4b5a8e-3c21-4f7e-9b0a-1e2d3c4b5a69", To: "+447700900000", Body: "ünïcode ✓ and \"quotes\"\nand a newline & = + %"},
		{Key: "3f1e2d3c-4b5a-4697-8a1b-2c3d4e5f6a7b", To: "+4915112345678", Body: strings.Repeat("long ", 300)},
	}
	senders := []struct {
		name          string
		from, service string
	}{
		{"a number", "+15550001111", ""},
		{"an alphanumeric sender", "Acme", ""},
		{"a messaging service", "+15550001111", twilioService},
	}
	type sent struct {
		key, from, service, receipts string
	}
	var want []sent
	for _, receipts := range []string{"", "https://receipts.example.com"} {
		for _, s := range senders {
			c, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: base, AccountSID: twilioAccount, AuthToken: "tok-secret",
				From: s.from, MessagingServiceSID: s.service, ReceiptsURL: receipts, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				o := c.Send(context.Background(), m)
				if o.Kind != provider.Sent || o.HTTPStatus != http.StatusCreated || o.Ref != created.SID {
					t.Errorf("%s, receipts %q: outcome %+v, want Sent 201 with the document's sid", s.name, receipts, o)
				}
				want = append(want, sent{m.Key, s.from, s.service, receipts})
			}
		}
	}
	xs := exchanges()
	if len(xs) != len(want) {
		t.Fatalf("prism saw %d requests, want %d", len(xs), len(want))
	}
	fields := d.formFields()
	for i, x := range xs {
		w := want[i]
		form, err := url.ParseQuery(string(x.body))
		if err != nil {
			t.Fatalf("request %d: the body is no form: %v", i, err)
		}
		if v := x.requestViolations(); len(v) > 0 || x.status != http.StatusCreated || x.method != http.MethodPost {
			t.Errorf("request %d (%s, fields %v): status %d, violations %+v", i, x.method, slices.Sorted(maps.Keys(form)), x.status, v)
		}
		if u := undefined(form, fields); len(u) > 0 {
			t.Errorf("request %d sends form fields the document does not define: %v", i, u)
		}
		// The fields that matter are there, each once, as configured.
		callback := ""
		if w.receipts != "" {
			callback = w.receipts + "/v1/receipts/twilio?ref=" + url.QueryEscape(w.key)
		}
		switch {
		case len(form["To"]) != 1 || len(form["Body"]) != 1:
			t.Errorf("request %d: To and Body not once each", i)
		case w.service != "" && (form.Get("MessagingServiceSid") != w.service || form.Has("From")):
			t.Errorf("request %d: MessagingServiceSid %q and From %v, want the service alone", i, form.Get("MessagingServiceSid"), form.Has("From"))
		case w.service == "" && (form.Get("From") != w.from || form.Has("MessagingServiceSid")):
			t.Errorf("request %d: not From alone", i)
		case form.Get("StatusCallback") != callback:
			t.Errorf("request %d: StatusCallback %q, want %q", i, form.Get("StatusCallback"), callback)
		}
	}
}

// TestTwilioLookupConformsToPublishedSpec points the adapter's lookup at
// the same mock: its first page (To, From unless a messaging service picks
// it, PageSize) and the next page it follows (the example page's
// next_page_uri, with Page and PageToken) are valid ListMessage requests
// with only parameters the document defines; it reads the example page
// (which always has a next page, so a lookup of the mock never ends: it
// stops at LookupPages and says so), finds the example's message by its
// text and creation time when that page is the last, and finds nothing in
// the document's empty page. That every page of a longer list is read is
// the stub's tests' (twilio_lookup_test.go, internal/smsstub).
func TestTwilioLookupConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	d := readTwilioSpec(t)
	var page struct {
		NextPageURI string `json:"next_page_uri"`
		Messages    []struct {
			SID, Body, Status, To string
			DateCreated           string `json:"date_created"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(d.list.example(t, "200", "readFullPage1"), &page); err != nil || page.NextPageURI == "" || len(page.Messages) == 0 {
		t.Fatalf("the document's example page has no next page or no messages: %v", err)
	}
	ex := page.Messages[0]
	exCreated, err := time.Parse(time.RFC1123Z, ex.DateCreated)
	if err != nil {
		t.Fatal(err)
	}
	base, prefer, exchanges := startPrism(t, twilioSpec, "")
	params := d.queryParams()
	resource := strings.Replace(twilioMessages, "{AccountSid}", twilioAccount, 1)
	lookup := func(base, service string, pages int, q provider.LookupQuery) provider.LookupResult {
		t.Helper()
		c, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: base, AccountSID: twilioAccount, AuthToken: "tok-secret",
			From: "+15550001111", MessagingServiceSID: service, Lookup: true, LookupPageSize: 50, LookupPages: pages, Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c.Lookup(context.Background(), q)
	}
	checkRequests := func(name string, from []prismExchange, want ...string) {
		t.Helper()
		if len(from) != len(want) {
			t.Fatalf("%s: prism saw %d requests, want %d", name, len(from), len(want))
		}
		for i, x := range from {
			u, err := url.Parse(x.uri)
			if err != nil {
				t.Fatal(err)
			}
			if x.method != http.MethodGet || x.status != http.StatusOK || len(x.requestViolations()) > 0 {
				t.Errorf("%s, page %d: %s, status %d, violations %+v", name, i+1, x.method, x.status, x.requestViolations())
			}
			if n := undefined(u.Query(), params); len(n) > 0 {
				t.Errorf("%s, page %d: query parameters the document does not define: %v", name, i+1, n)
			}
			if x.uri != want[i] {
				t.Errorf("%s, page %d: asked for %s, want %s", name, i+1, redactQuery(x.uri), redactQuery(want[i]))
			}
		}
	}

	// Paging: page 1 as the adapter makes it, page 2 as the document's
	// example says; the mock's list never ends.
	r := lookup(base, "", 2, provider.LookupQuery{To: testMsg.To, Body: ex.Body})
	if !errors.Is(r.Err, provider.ErrLookupIncomplete) || r.Found != nil {
		t.Errorf("lookup of the endless example list: %+v, want ErrLookupIncomplete", r)
	}
	first := resource + "?" + url.Values{"To": {testMsg.To}, "From": {"+15550001111"}, "PageSize": {"50"}}.Encode()
	next, _ := url.Parse(page.NextPageURI)
	if q := next.Query(); q.Get("Page") == "" || q.Get("PageToken") == "" {
		t.Fatalf("the example's next page has no Page and PageToken")
	}
	checkRequests("paging", exchanges(), first, page.NextPageURI)

	// Through a messaging service: no From.
	n := len(exchanges())
	_ = lookup(base, twilioService, 1, provider.LookupQuery{To: testMsg.To, Body: ex.Body})
	checkRequests("a messaging service", exchanges()[n:], resource+"?"+url.Values{"To": {testMsg.To}, "PageSize": {"50"}}.Encode())

	// The document's empty page ends the list: nothing found.
	n = len(exchanges())
	prefer("example=readEmptySentdateLess")
	if r := lookup(base, "", 2, provider.LookupQuery{To: testMsg.To, Body: ex.Body}); r.Err != nil || len(r.Found) != 0 {
		t.Errorf("lookup of the empty example page: %+v, want nothing found", r)
	}
	prefer("")
	checkRequests("an empty page", exchanges()[n:], first)

	// The example page as the last one (a proxy takes its next_page_uri
	// away): its message with the text, created since Since, is found.
	last := lastPage(t, base)
	n = len(exchanges())
	for _, tt := range []struct {
		name  string
		q     provider.LookupQuery
		found []provider.Found
	}{
		{"the example's text", provider.LookupQuery{To: ex.To, Body: ex.Body},
			[]provider.Found{{Ref: ex.SID, Status: "accepted", Created: exCreated}}},
		{"created since", provider.LookupQuery{To: ex.To, Body: ex.Body, Since: exCreated.Add(provider.LookupMargin - time.Second)},
			[]provider.Found{{Ref: ex.SID, Status: "accepted", Created: exCreated}}},
		{"created before since", provider.LookupQuery{To: ex.To, Body: ex.Body, Since: exCreated.Add(provider.LookupMargin + time.Second)}, nil},
		{"another text", provider.LookupQuery{To: ex.To, Body: "not the example's"}, nil},
	} {
		r := lookup(last, "", 2, tt.q)
		if r.Err != nil || len(r.Found) != len(tt.found) {
			t.Errorf("%s: %+v, want %+v", tt.name, r, tt.found)
			continue
		}
		for i, f := range r.Found {
			if w := tt.found[i]; f.Ref != w.Ref || f.Status != w.Status || !f.Created.Equal(w.Created) {
				t.Errorf("%s: found %+v, want %+v", tt.name, f, w)
			}
		}
	}
	xs := exchanges()[n:]
	if len(xs) != 4 {
		t.Fatalf("the last-page lookups made %d requests, want 4", len(xs))
	}
	for _, x := range xs {
		if x.status != http.StatusOK || len(x.requestViolations()) > 0 {
			t.Errorf("last-page lookup: status %d, violations %+v", x.status, x.requestViolations())
		}
	}
}

// redactQuery is uri with its query's values but PageSize, Page and
// PageToken replaced by x (numbers do not go to the test log).
func redactQuery(uri string) string {
	path, query, _ := strings.Cut(uri, "?")
	vs, _ := url.ParseQuery(query)
	for k := range vs {
		switch k {
		case "PageSize", "Page", "PageToken":
		default:
			vs[k] = []string{"x"}
		}
	}
	return path + "?" + vs.Encode()
}

// lastPage is a proxy to base that sets every list page's next_page_uri to
// null: the document's example page as the last page of its list.
func lastPage(t *testing.T, base string) string {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var page map[string]json.RawMessage
		if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &page) == nil {
			if _, ok := page["next_page_uri"]; ok {
				page["next_page_uri"] = json.RawMessage("null")
				body, _ = json.Marshal(page)
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL
}

// The mock does validate: requests the document does not allow are
// refused with their violations (a missing To, a malformed AccountSid,
// MessagingServiceSid or StatusCallback, a PageSize out of its range, no
// credentials), the adapter's own requests among them when misconfigured;
// and the check of names finds a field or parameter the document lacks.
func TestPrismValidatesTwilioRequests(t *testing.T) {
	t.Parallel()
	d := readTwilioSpec(t)
	base, _, exchanges := startPrism(t, twilioSpec, "")
	resource := base + strings.Replace(twilioMessages, "{AccountSid}", twilioAccount, 1)
	do := func(method, u string, form url.Values, auth bool) {
		t.Helper()
		req, err := http.NewRequest(method, u, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if auth {
			req.SetBasicAuth(twilioAccount, "tok-secret")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	valid := url.Values{"To": {"+15551234567"}, "From": {"+15550001111"}, "Body": {"hi"}}
	with := func(k, v string) url.Values {
		f := url.Values{}
		for name, vs := range valid {
			f[name] = slices.Clone(vs)
		}
		if v == "" {
			f.Del(k)
		} else {
			f.Set(k, v)
		}
		return f
	}
	type refusal struct {
		name     string
		status   int
		location string // the violation's place, "" for a 401
	}
	var want []refusal
	do(http.MethodPost, resource, with("To", ""), true)
	want = append(want, refusal{"no To", 422, "body"})
	do(http.MethodPost, resource, with("StatusCallback", "not a url"), true)
	want = append(want, refusal{"StatusCallback no URL", 422, "StatusCallback"})
	do(http.MethodPost, resource, valid, false)
	want = append(want, refusal{"no credentials", 401, ""})
	do(http.MethodPost, resource, with("ValidityPeriod", "abc"), true)
	want = append(want, refusal{"ValidityPeriod not a number", 422, "ValidityPeriod"})
	do(http.MethodPost, resource, with("ValidityPeriod", "1.5"), true)
	want = append(want, refusal{"ValidityPeriod not an integer", 422, "ValidityPeriod"})
	do(http.MethodGet, resource+"?PageSize=0", nil, true)
	want = append(want, refusal{"PageSize 0", 422, "pagesize"})
	do(http.MethodGet, resource+"?PageSize=1001", nil, true)
	want = append(want, refusal{"PageSize 1001", 422, "pagesize"})

	// The adapter's requests, misconfigured.
	for _, tt := range []struct {
		name string
		cfg  provider.TwilioConfig
		loc  string
	}{
		{"AccountSid malformed", provider.TwilioConfig{AccountSID: "AC123", From: "+15550001111"}, "accountsid"},
		{"MessagingServiceSid malformed", provider.TwilioConfig{AccountSID: twilioAccount, MessagingServiceSID: "MG9"}, "MessagingServiceSid"},
	} {
		tt.cfg.BaseURL, tt.cfg.AuthToken, tt.cfg.Timeout = base, "tok-secret", 20*time.Second
		c, err := provider.NewTwilio(tt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if o := send(t, c); o.Kind == provider.Sent {
			t.Errorf("%s: sent, want refused", tt.name)
		}
		want = append(want, refusal{tt.name, 422, tt.loc})
	}
	xs := exchanges()
	if len(xs) != len(want) {
		t.Fatalf("prism saw %d requests, want %d", len(xs), len(want))
	}
	for i, x := range xs {
		w := want[i]
		vs := x.requestViolations()
		found := false
		for _, v := range vs {
			found = found || (w.location == "" && fmt.Sprint(v.Code) == "401") || slices.Contains(v.Location, w.location)
		}
		if x.status != w.status || !found {
			t.Errorf("%s: status %d, violations %+v; want %d with a violation at %q", w.name, x.status, vs, w.status, w.location)
		}
	}

	// ValidityPeriods out of the document's bounds, which Prism lets
	// through (the bounds are words in a description, not schema
	// keywords), and which the tests' own check of the bounds, read from
	// those words, refuses.
	lo, hi, _ := d.validityBounds(t)
	n := len(xs)
	for _, v := range []string{"0", "36001", "-5"} {
		do(http.MethodPost, resource, with("ValidityPeriod", v), true)
		if err := inValidityBounds(v, lo, hi); err == nil {
			t.Errorf("ValidityPeriod %s: the tests' bounds check lets it through", v)
		}
	}
	for _, x := range exchanges()[n:] {
		if x.status != http.StatusCreated || len(x.requestViolations()) > 0 {
			t.Errorf("Prism now refuses ValidityPeriod out of bounds (status %d, violations %+v): "+
				"let the mock check the bounds (validityBounds)", x.status, x.requestViolations())
		}
	}
	for _, v := range []string{"1", "36000"} {
		if err := inValidityBounds(v, lo, hi); err != nil {
			t.Errorf("the tests' bounds check refuses ValidityPeriod %s: %v", v, err)
		}
	}

	// Names Prism lets through, which the tests check themselves.
	if u := undefined(url.Values{"To": {"x"}, "StatusCallbackUrl": {"x"}}, d.formFields()); !slices.Equal(u, []string{"StatusCallbackUrl"}) {
		t.Errorf("undefined form fields %v, want [StatusCallbackUrl]", u)
	}
	if u := undefined(url.Values{"To": {"x"}, "DateCreated": {"x"}, "PageSize": {"1"}}, d.queryParams()); !slices.Equal(u, []string{"DateCreated"}) {
		t.Errorf("undefined query parameters %v, want [DateCreated]", u)
	}
}

// validityBounds reads the bounds of CreateMessage's ValidityPeriod from
// the document. Its schema says only "type": "integer"; the bounds, and the
// default, are in its description ("Accepted values are integers from `1`
// to `36000`. Default value is `36000`."), which Prism does not read: it
// takes 0 and 36001 (TestPrismValidatesTwilioRequests shows it), so the
// tests check the bounds themselves, from the document's own words.
func (d twilioDoc) validityBounds(t *testing.T) (lo, hi, def int) {
	t.Helper()
	var p struct {
		Type        string   `json:"type"`
		Description string   `json:"description"`
		Minimum     *float64 `json:"minimum"`
		Maximum     *float64 `json:"maximum"`
	}
	raw := d.create.RequestBody.Content["application/x-www-form-urlencoded"].Schema.Properties["ValidityPeriod"]
	if err := json.Unmarshal(raw, &p); err != nil || p.Type != "integer" {
		t.Fatalf("CreateMessage's ValidityPeriod is not an integer field (%v): %s", err, raw)
	}
	if p.Minimum != nil || p.Maximum != nil {
		t.Fatalf("ValidityPeriod now has minimum %v and maximum %v in its schema: Prism checks them, so the tests may let it (see validityBounds)", p.Minimum, p.Maximum)
	}
	m := regexp.MustCompile("Accepted values are integers from `([0-9]+)` to `([0-9]+)`\\. Default value is `([0-9]+)`\\.").FindStringSubmatch(p.Description)
	if m == nil {
		t.Fatalf("ValidityPeriod's description no longer gives its bounds as the tests read them: %q", p.Description)
	}
	lo, _ = strconv.Atoi(m[1])
	hi, _ = strconv.Atoi(m[2])
	def, _ = strconv.Atoi(m[3])
	return lo, hi, def
}

// inValidityBounds says why v is not a ValidityPeriod the document allows
// (an integer from lo to hi), or nil.
func inValidityBounds(v string, lo, hi int) error {
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return fmt.Errorf("ValidityPeriod %q is not an integer", v)
	case n < lo || n > hi:
		return fmt.Errorf("ValidityPeriod %d is not from %d to %d", n, lo, hi)
	}
	return nil
}

// TestTwilioValidityPeriodConformsToPublishedSpec points the Twilio
// adapter at Prism serving Twilio's document, with messages that expire:
// each create carries the time left as ValidityPeriod, a form field the
// document defines, once, an integer within the bounds its description
// gives (which Prism cannot check, so the test does), and draws the
// document's 201 and no violation. Less than two seconds left is the
// minimum, 1; an hour is about 3600, never more; a day is the maximum,
// which the document gives as the default too (what the adapter's clamp
// relies on). A message without an expiry carries none.
func TestTwilioValidityPeriodConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	d := readTwilioSpec(t)
	lo, hi, def := d.validityBounds(t)
	if lo != 1 || hi != 36000 || def != hi {
		t.Fatalf("the document gives ValidityPeriod %d to %d, default %d; the adapter clamps to 1 to 36000, the default", lo, hi, def)
	}
	base, _, exchanges := startPrism(t, twilioSpec, "")
	c, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: base, AccountSID: twilioAccount, AuthToken: "tok-secret",
		From: "+15550001111", ReceiptsURL: "https://receipts.example.com", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		left   time.Duration // 0: no expiry
		lo, hi int           // the ValidityPeriod wanted; 0, 0: none
	}{
		{"1.5 s left", 1500 * time.Millisecond, 1, 1},
		{"an hour left", time.Hour, 3600 - 10, 3600},
		{"a day left", 24 * time.Hour, 36000, 36000},
		{"no expiry", 0, 0, 0},
	}
	for _, tt := range cases {
		m := testMsg
		if tt.left != 0 {
			m.ExpiresAt = time.Now().Add(tt.left)
		}
		if o := c.Send(context.Background(), m); o.Kind != provider.Sent || o.HTTPStatus != http.StatusCreated {
			t.Errorf("%s: outcome %+v, want Sent 201", tt.name, o)
		}
	}
	xs := exchanges()
	if len(xs) != len(cases) {
		t.Fatalf("prism saw %d requests, want %d", len(xs), len(cases))
	}
	fields := d.formFields()
	for i, x := range xs {
		tt := cases[i]
		form, err := url.ParseQuery(string(x.body))
		if err != nil {
			t.Fatalf("%s: the body is no form: %v", tt.name, err)
		}
		if v := x.requestViolations(); len(v) > 0 || x.status != http.StatusCreated {
			t.Errorf("%s: status %d, violations %+v", tt.name, x.status, v)
		}
		if u := undefined(form, fields); len(u) > 0 {
			t.Errorf("%s: form fields the document does not define: %v", tt.name, u)
		}
		vs := form["ValidityPeriod"]
		if tt.hi == 0 {
			if len(vs) != 0 {
				t.Errorf("%s: ValidityPeriod %v, want none", tt.name, vs)
			}
			continue
		}
		if len(vs) != 1 {
			t.Errorf("%s: ValidityPeriod %v, want it once", tt.name, vs)
			continue
		}
		if err := inValidityBounds(vs[0], lo, hi); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		if n, _ := strconv.Atoi(vs[0]); n < tt.lo || n > tt.hi {
			t.Errorf("%s: ValidityPeriod %d, want %d to %d", tt.name, n, tt.lo, tt.hi)
		}
	}
}
