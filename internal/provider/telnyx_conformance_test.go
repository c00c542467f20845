package provider_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

// telnyxSpec is Telnyx's published OpenAPI document of its API v2
// (testdata/telnyx/README.md says where it comes from).
const telnyxSpec = "testdata/telnyx/spec3.yml"

// telnyxExampleID is the message id of the document's MessageResponse
// example, which Prism answers with.
const telnyxExampleID = "40385f64-5717-4562-b3fc-2c963f66afa6"

// telnyxServer is the document's server URL: its paths (/messages) are
// under it.
func telnyxServer(t *testing.T) *url.URL {
	t.Helper()
	return specServer(t, telnyxSpec, "\nservers:\n- description: Version 2.0.0 of the Telnyx API\n  url: ")
}

// The document is the one testdata/telnyx/README.md names, unchanged, and
// says it is MIT licensed (the licence the README relies on).
func TestTelnyxSpecIsThePublishedOne(t *testing.T) {
	t.Parallel()
	doc := publishedSpec(t, telnyxSpec)
	if !bytes.Contains(doc, []byte("\ninfo:\n  contact:\n    email: support@telnyx.com\n")) || !bytes.Contains(doc, []byte("\n  license:\n    name: MIT\n")) {
		t.Errorf("%s does not declare the MIT licence in info.license: check its licence before keeping it", telnyxSpec)
	}
}

// The adapter's default endpoint is the document's server and path.
func TestTelnyxDefaultEndpointIsTheDocuments(t *testing.T) {
	t.Parallel()
	var got string
	c, err := provider.NewTelnyx(provider.TelnyxConfig{APIKey: "KEY0123456789", From: "Acme",
		Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
			got = r.URL.String()
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(telnyxSent)), Header: http.Header{}, Request: r}, nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	if o := send(t, c); o.Kind != provider.Sent {
		t.Fatalf("outcome %+v", o)
	}
	if want := telnyxServer(t).String() + "/messages"; got != want {
		t.Errorf("the adapter POSTs to %s, the document's SendMessage is %s", got, want)
	}
}

// startTelnyxPrism runs Prism as a validating mock of Telnyx's document.
func startTelnyxPrism(t *testing.T) (base string, prefer func(string), exchanges func() []prismExchange) {
	t.Helper()
	return startPrism(t, telnyxSpec, telnyxServer(t).Path)
}

// TestTelnyxConformsToPublishedSpec points the Telnyx adapter at Prism
// serving Telnyx's own OpenAPI document, over real HTTP: every request it
// makes must be valid for the document (no request violation, and the
// document's 200 with its example id), and it must classify the error
// answer the document defines (default: the Errors schema), at each status
// Telnyx's error references give, as docs/providers.md says.
func TestTelnyxConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	base, prefer, exchanges := startTelnyxPrism(t)
	msgs := []provider.Message{
		testMsg,
		{Key: "7d4b5a8e-3c21-4f7e-9b0a-1e2d3c4b5a69", To: "+447700900000", Body: "ünïcode ✓ and \"quotes\"\nand a newline"},
		{Key: "3f1e2d3c-4b5a-4697-8a1b-2c3d4e5f6a7b", To: "4915112345678", Body: strings.Repeat("long ", 150)},
	}
	senders := []struct{ from, profile string }{
		{from: "+15550001111"},
		{from: "Acme", profile: "4000eba1-a0c0-4563-9925-b25e842a7cb6"},
		{profile: "4000eba1-a0c0-4563-9925-b25e842a7cb6"},
	}
	n := 0
	for _, receipts := range []string{"", "https://receipts.example.com", "https://receipts.example.com/base/"} {
		for _, s := range senders {
			c, err := provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base, APIKey: "KEY0123456789", From: s.from, MessagingProfileID: s.profile, ReceiptsURL: receipts, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				n++
				o := c.Send(context.Background(), m)
				if o.Kind != provider.Sent || o.HTTPStatus != http.StatusOK || o.Ref != telnyxExampleID {
					t.Errorf("from %q, profile %q, receipts %q: outcome %+v, want Sent 200 with the document's data.id", s.from, s.profile, receipts, o)
				}
			}
		}
	}
	xs := exchanges()
	if len(xs) != n {
		t.Fatalf("prism saw %d requests, want %d", len(xs), n)
	}
	for _, x := range xs {
		if v := x.requestViolations(); len(v) > 0 || x.status != http.StatusOK {
			t.Errorf("request %s: status %d, violations %+v", x.body, x.status, v)
		}
	}

	// The document's error answer at each status Telnyx documents.
	tests := []struct {
		status int
		want   provider.Kind
	}{
		{400, provider.Permanent},
		{401, provider.Permanent},
		{403, provider.Permanent},
		{404, provider.Permanent},
		{408, provider.Ambiguous},
		{422, provider.Permanent},
		{429, provider.Retry},
		{500, provider.Ambiguous},
		{502, provider.Ambiguous},
		{503, provider.Ambiguous},
	}
	c, err := provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base, APIKey: "KEY0123456789", From: "+15550001111", ReceiptsURL: "https://receipts.example.com", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		prefer(fmt.Sprintf("code=%d", tt.status))
		o := c.Send(context.Background(), testMsg)
		if o.Kind != tt.want || o.HTTPStatus != tt.status || o.Reason == "" || o.Reason == http.StatusText(tt.status) {
			t.Errorf("status %d: outcome %+v, want %v with the document's error title as reason", tt.status, o, tt.want)
		}
		assertNoSecrets(t, o)
	}
	for _, x := range exchanges()[n:] {
		if v := x.requestViolations(); len(v) > 0 {
			t.Errorf("request %s: violations %+v", x.body, v)
		}
	}
}

// The mock does validate: requests the document does not allow are
// answered with their violations, and one without the Bearer key is
// refused for its security scheme.
func TestPrismValidatesTelnyxRequests(t *testing.T) {
	t.Parallel()
	base, _, exchanges := startTelnyxPrism(t)
	post := func(body string, auth bool) {
		req, err := http.NewRequest(http.MethodPost, base+"/v2/messages", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if auth {
			req.Header.Set("Authorization", "Bearer KEY0123456789")
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	invalid := []string{
		`{"from":"+15550001111","text":"no to"}`,
		`{"to":"+15551234567","from":"+15550001111","text":"hi","use_profile_webhooks":"false"}`,
		`{"to":"+15551234567","from":"+15550001111","text":"hi","type":"FAX"}`,
		`{"to":["+15551234567"],"from":"+15550001111","text":"to as a list"}`,
		`{"to":"+15551234567","from":"+15550001111","text":"hi","webhook_url":"not a url"}`,
	}
	for _, b := range invalid {
		post(b, true)
	}
	post(`{"to":"+15551234567","from":"+15550001111","text":"no key"}`, false)
	xs := exchanges()
	if len(xs) != len(invalid)+1 {
		t.Fatalf("prism saw %d requests, want %d", len(xs), len(invalid)+1)
	}
	for i, x := range xs {
		want := http.StatusUnprocessableEntity
		if i == len(invalid) {
			want = http.StatusUnauthorized
		}
		if x.status != want || len(x.requestViolations()) == 0 {
			t.Errorf("invalid request %s: status %d, violations %+v; want %d with violations", x.body, x.status, x.violations, want)
		}
	}
}
