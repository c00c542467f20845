package provider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sendonce/sendonce/internal/provider"
)

// sinchSpec is Sinch's published OpenAPI document of its SMS REST API
// (testdata/sinch/README.md says where it comes from).
const sinchSpec = "testdata/sinch/sms.yaml"

// The document is the one testdata/sinch/README.md names, unchanged.
func TestSinchSpecIsThePublishedOne(t *testing.T) {
	t.Parallel()
	doc := publishedSpec(t, sinchSpec)
	// The adapter's default base URL is the document's server.
	if !bytes.Contains(doc, []byte("servers:\n  - url: \"https://us.sms.api.sinch.com\"\n")) {
		t.Error("the document's server is not https://us.sms.api.sinch.com, the adapter's default")
	}
}

// TestSinchConformsToPublishedSpec points the Sinch adapter at Prism
// serving Sinch's own OpenAPI document, over real HTTP: every request it
// makes, sends and lookups, must be valid for the document (no request
// violation, and the document's 201 or 200), and it must classify each
// error answer the document defines for the send, with its example body,
// as docs/providers.md says.
func TestSinchConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	base, prefer, exchanges := startPrism(t, sinchSpec, "")
	msgs := []provider.Message{
		testMsg,
		{Key: "7d4b5a8e-3c21-4f7e-9b0a-1e2d3c4b5a69", To: "+447700900000", Body: "ünïcode ✓ and \"quotes\"\nand a newline"},
		{Key: "3f1e2d3c-4b5a-4697-8a1b-2c3d4e5f6a7b", To: "+4915112345678", Body: strings.Repeat("long ", 150)},
	}
	for _, receipts := range []string{"", "https://receipts.example.com"} {
		for _, from := range []string{"+15550001111", "Acme"} {
			c, err := provider.NewSinch(provider.SinchConfig{BaseURL: base, ServicePlanID: "jd63jf88477ll", APIToken: "s3cret-token", From: from, ReceiptsURL: receipts, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				o := c.Send(context.Background(), m)
				if o.Kind != provider.Sent || o.HTTPStatus != http.StatusCreated || o.Ref == "" {
					t.Errorf("from %q, receipts %q: outcome %+v, want Sent 201 with the batch id", from, receipts, o)
				}
			}
		}
	}
	xs := exchanges()
	if len(xs) != 12 {
		t.Fatalf("prism saw %d requests, want 12", len(xs))
	}
	for _, x := range xs {
		if v := x.requestViolations(); len(v) > 0 || x.status != http.StatusCreated {
			t.Errorf("request %s: status %d, violations %+v", x.body, x.status, v)
		}
	}

	// Each error the document defines for the send, with its example body.
	c, err := provider.NewSinch(provider.SinchConfig{BaseURL: base, ServicePlanID: "jd63jf88477ll", APIToken: "s3cret-token", From: "Acme", Timeout: 20 * time.Second, Lookup: true, LookupPages: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		prefer, reason string
		status         int
	}{
		{"code=400", "syntax_invalid_parameter_format: ", 400},
		{"code=403", "missing_callback_url: Requesting delivery report", 403},
	} {
		prefer(tt.prefer)
		o := c.Send(context.Background(), testMsg)
		if o.Kind != provider.Permanent || o.HTTPStatus != tt.status || !strings.HasPrefix(o.Reason, tt.reason) {
			t.Errorf("%s: outcome %+v, want Permanent with the document's example error as reason", tt.prefer, o)
		}
		assertNoSecrets(t, o)
	}
	prefer("")

	// The lookup's pages are the document's ListBatches. Prism answers
	// each with the document's example page (a count of 2000, of which it
	// gives a few): more than three pages hold, so the lookup says it
	// could not read everything, never "none".
	before := len(exchanges())
	r := c.Lookup(context.Background(), provider.LookupQuery{Reference: testMsg.Key, Since: time.Now().Add(-time.Hour)})
	if !errors.Is(r.Err, provider.ErrLookupIncomplete) || r.Found != nil {
		t.Errorf("lookup = %+v, want ErrLookupIncomplete from the document's example count", r)
	}
	lookups := exchanges()[before:]
	if len(lookups) != 3 {
		t.Fatalf("prism saw %d lookup requests, want 3 pages", len(lookups))
	}
	for _, x := range append(exchanges()[12:before], lookups...) {
		if v := x.requestViolations(); len(v) > 0 {
			t.Errorf("request %s: violations %+v", x.body, v)
		}
	}
	for _, x := range lookups {
		if x.status != http.StatusOK {
			t.Errorf("lookup page: status %d, want the document's 200", x.status)
		}
	}
}

// The mock does validate: requests the document does not allow, a send
// and a lookup, are answered with their violations.
func TestPrismValidatesSinchRequests(t *testing.T) {
	t.Parallel()
	base, _, exchanges := startPrism(t, sinchSpec, "")
	// Prism's verdict is in sl-violations, or, when the document gives
	// the operation no answer for an invalid request, in its own 422's
	// "validation" list.
	var answers []string
	do := func(method, path, body string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer s3cret-token")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		ans, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers = append(answers, string(ans))
	}
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"from":"Acme","body":"no to"}`)
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":"+15551234567","from":"Acme","body":"to is not a list"}`)
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":["+15551234567"],"from":"Acme"}`)
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":["+15551234567"],"from":"Acme","body":"x","client_reference":"`+strings.Repeat("r", 129)+`"}`)
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":["+15551234567"],"from":"Acme","body":"x","delivery_report":"per_message"}`)
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":["+15551234567"],"from":"Acme","body":"x","expire_at":"tomorrow"}`)
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":["+15551234567"],"from":"Acme","body":"x","expire_at":"2030-01-02"}`)
	do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":["+15551234567"],"from":"Acme","body":"x","expire_at":1893553445}`)
	do(http.MethodGet, "/xms/v1/plan1/batches?"+url.Values{"page_size": {"500"}}.Encode(), "")
	xs := exchanges()
	if len(xs) != 9 {
		t.Fatalf("prism saw %d requests, want 9", len(xs))
	}
	for i, x := range xs {
		if x.status < 400 || (len(x.requestViolations()) == 0 && !strings.Contains(answers[i], `"validation":[{"location":["query"`)) {
			t.Errorf("invalid request %q: status %d, violations %+v, answer %s; want a refusal with violations", x.body, x.status, x.violations, answers[i])
		}
	}

	// An expire_at out of its bounds, which Prism lets through (they are
	// words in a description: "Must be after send_at", three days at
	// most), and which the tests' own check refuses.
	now := time.Now()
	for _, tt := range []struct {
		v        string
		inBounds bool
	}{
		{"2001-01-01T00:00:00.000Z", false},                                      // long past
		{now.UTC().Format("2006-01-02T15:04:05.000Z07:00"), false},               // not after the send
		{now.Add(4 * 24 * time.Hour).UTC().Format(time.RFC3339), false},          // more than three days
		{now.Add(time.Hour).UTC().Format("2006-01-02T15:04:05.000Z07:00"), true}, // the control
	} {
		n := len(exchanges())
		do(http.MethodPost, "/xms/v1/plan1/batches", `{"to":["+15551234567"],"from":"Acme","body":"x","expire_at":"`+tt.v+`"}`)
		x := exchanges()[n]
		if x.status != http.StatusCreated || len(x.requestViolations()) > 0 {
			t.Errorf("Prism now refuses expire_at %s (status %d, violations %+v): let the mock check the bounds", tt.v, x.status, x.requestViolations())
		}
		if err := checkExpireAt(tt.v, now, time.Now()); (err == nil) != tt.inBounds {
			t.Errorf("expire_at %s: the tests' bounds check says %v, want in bounds %v", tt.v, err, tt.inBounds)
		}
	}
}

// sinchExpireAtWords reads what the document says of a batch's expire_at
// (sendBatchObject, the send's body): its type and format, and its
// description, which holds its bounds in words ("Must be after send_at.
// Default is 3 days after send_at."); the schema has no keyword Prism
// could check them by.
func sinchExpireAtWords(t *testing.T) (typ, format, description string) {
	t.Helper()
	raw, err := os.ReadFile(sinchSpec)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Type        string `yaml:"type"`
					Format      string `yaml:"format"`
					Description string `yaml:"description"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	p, ok := doc.Components.Schemas["sendBatchObject"].Properties["expire_at"]
	if !ok {
		t.Fatal("the document's sendBatchObject has no expire_at")
	}
	return p.Type, p.Format, strings.Join(strings.Fields(p.Description), " ")
}

// sinchExpireAtLayout is how the adapter writes expire_at, as Sinch's SDK
// does (a JavaScript Date's toISOString): UTC, to the millisecond.
var sinchExpireAtLayout = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$`)

// checkExpireAt says why v is not an expire_at the document allows for a
// batch sent between before and after, its send_at (none is sent, so it is
// when Sinch took the batch): after send_at, and no later than three days
// after it (the SDK's maximum, the document's default); nil if it is.
func checkExpireAt(v string, before, after time.Time) error {
	at, err := time.Parse(time.RFC3339Nano, v)
	switch {
	case err != nil:
		return fmt.Errorf("expire_at %q is not an RFC 3339 date-time: %v", v, err)
	case !at.After(after):
		return fmt.Errorf("expire_at %s is not after the batch's send_at (no later than %s)", v, after.UTC().Format(time.RFC3339Nano))
	case at.After(after.Add(3 * 24 * time.Hour)):
		return fmt.Errorf("expire_at %s is more than 3 days after the batch's send_at", v)
	}
	return nil
}

// TestSinchExpireAtConformsToPublishedSpec points the Sinch adapter at
// Prism serving Sinch's document, with messages that expire: each batch
// carries expire_at, the property the document defines for it (a
// date-time, "If set the system will stop trying to deliver the message at
// this point"), in the SDK's form (UTC, milliseconds), after its send_at and
// no more than three days after it (bounds the document gives in words,
// which the test checks itself), and draws the document's 201 and no
// violation. An hour left is the expiry itself, to the millisecond; less
// than a second left is a second after the send; more than three days
// left is three days. A message without an expiry carries none.
func TestSinchExpireAtConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	typ, format, words := sinchExpireAtWords(t)
	if typ != "string" || format != "date-time" || !strings.Contains(words, "Must be after send_at.") || !strings.Contains(words, "Default is 3 days after send_at.") {
		t.Fatalf("the document's expire_at is %s %s, %q: not what the adapter's bounds read", typ, format, words)
	}
	base, _, exchanges := startPrism(t, sinchSpec, "")
	c, err := provider.NewSinch(provider.SinchConfig{BaseURL: base, ServicePlanID: "jd63jf88477ll", APIToken: "s3cret-token",
		From: "Acme", ReceiptsURL: "https://receipts.example.com", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type sent struct {
		name          string
		expiresAt     time.Time
		before, after time.Time
	}
	var cases []sent
	for _, tt := range []struct {
		name string
		left time.Duration
	}{
		{"an hour left", time.Hour},
		{"0.9 s left", 900 * time.Millisecond},
		{"four days left", 96 * time.Hour},
		{"no expiry", 0},
	} {
		m := testMsg
		before := time.Now()
		if tt.left != 0 {
			// Microseconds, as Postgres keeps them: the adapter drops
			// what a millisecond does not hold.
			m.ExpiresAt = before.Add(tt.left).Round(time.Microsecond)
		}
		o := c.Send(context.Background(), m)
		if o.Kind != provider.Sent || o.HTTPStatus != http.StatusCreated {
			t.Errorf("%s: outcome %+v, want Sent 201", tt.name, o)
		}
		cases = append(cases, sent{tt.name, m.ExpiresAt, before, time.Now()})
	}
	xs := exchanges()
	if len(xs) != len(cases) {
		t.Fatalf("prism saw %d requests, want %d", len(xs), len(cases))
	}
	for i, x := range xs {
		tt := cases[i]
		if v := x.requestViolations(); len(v) > 0 || x.status != http.StatusCreated {
			t.Errorf("%s: status %d, violations %+v", tt.name, x.status, v)
		}
		var body map[string]any
		if err := json.Unmarshal(x.body, &body); err != nil {
			t.Fatal(err)
		}
		v, ok := body["expire_at"].(string)
		if tt.expiresAt.IsZero() {
			if _, has := body["expire_at"]; has {
				t.Errorf("%s: expire_at %v, want none", tt.name, body["expire_at"])
			}
			continue
		}
		if !ok {
			t.Errorf("%s: expire_at %v, want a date-time", tt.name, body["expire_at"])
			continue
		}
		if !sinchExpireAtLayout.MatchString(v) {
			t.Errorf("%s: expire_at %s, want a UTC date-time to the millisecond", tt.name, v)
		}
		if err := checkExpireAt(v, tt.before, tt.after); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		at, _ := time.Parse(time.RFC3339Nano, v)
		switch left := tt.expiresAt.Sub(tt.before); {
		case left > 72*time.Hour:
			if at.Before(tt.before.Add(72*time.Hour).Add(-time.Millisecond)) || at.After(tt.after.Add(72*time.Hour)) {
				t.Errorf("%s: expire_at %s, want three days after the send", tt.name, v)
			}
		case left < time.Second:
			if at.Before(tt.before.Add(time.Second).Add(-time.Millisecond)) || at.After(tt.after.Add(time.Second)) {
				t.Errorf("%s: expire_at %s, want a second after the send", tt.name, v)
			}
		default:
			if want := tt.expiresAt.UTC().Truncate(time.Millisecond); !at.Equal(want) {
				t.Errorf("%s: expire_at %s, want the expiry to the millisecond, %s", tt.name, v, want.Format(time.RFC3339Nano))
			}
		}
	}
}
