package provider_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

// vonageSpec is Vonage's published OpenAPI document of the Messages API
// (testdata/vonage/README.md says where it comes from).
const vonageSpec = "testdata/vonage/messages-olympus.yml"

// vonageErratum is the one line the conformance test takes out of the
// published document: its baseMessageType requires a property "message"
// that no message type defines and that neither Vonage's API nor its SDKs
// send (testdata/vonage/README.md).
const vonageErratum = "      required:\n        - to\n        - from\n        - message\n        - message_type\n"

// vonageServer is the document's server URL: its paths ("/") are under it.
func vonageServer(t *testing.T) *url.URL {
	t.Helper()
	return specServer(t, vonageSpec, "\nservers:\n  - url: ")
}

// The document is the one testdata/vonage/README.md names, unchanged.
func TestVonageSpecIsThePublishedOne(t *testing.T) {
	t.Parallel()
	publishedSpec(t, vonageSpec)
}

// The adapter's default base URL is the document's server.
func TestVonageDefaultBaseIsTheDocumentsServer(t *testing.T) {
	t.Parallel()
	if got, want := "https://api.nexmo.com/v1/messages", vonageServer(t).String(); got != want {
		t.Errorf("the adapter POSTs to %s, the document's server is %s", got, want)
	}
}

// correctedSpec writes the published document less its erratum to a
// temporary file: the erratum must be there, once.
func correctedSpec(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(vonageSpec)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(doc, []byte(vonageErratum)); n != 1 {
		t.Fatalf("the published document has the erratum %d times, want once: has testdata/vonage changed?", n)
	}
	fixed := bytes.Replace(doc, []byte(vonageErratum), []byte("      required:\n        - to\n        - from\n        - message_type\n"), 1)
	p := filepath.Join(t.TempDir(), "messages-olympus.yml")
	if err := os.WriteFile(p, fixed, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestVonageConformsToPublishedSpec points the Vonage adapter at Prism
// serving Vonage's own OpenAPI document, over real HTTP: every request it
// makes must be valid for the document (no request violation, and the
// document's 202), and it must classify each error answer the document
// defines, in the shape the document gives it, as docs/providers.md says.
func TestVonageConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	base, prefer, exchanges := startPrism(t, correctedSpec(t), vonageServer(t).Path)
	msgs := []provider.Message{
		testMsg,
		{Key: "7d4b5a8e-3c21-4f7e-9b0a-1e2d3c4b5a69", To: "+447700900000", Body: "ünïcode ✓ and \"quotes\"\nand a newline"},
		{Key: "3f1e2d3c-4b5a-4697-8a1b-2c3d4e5f6a7b", To: "+4915112345678", Body: strings.Repeat("long ", 150)},
	}
	for _, receipts := range []string{"", "https://receipts.example.com"} {
		for _, from := range []string{"+15550001111", "Acme"} {
			c, err := provider.NewVonage(provider.VonageConfig{BaseURL: base, APIKey: "abcd1234", APISecret: "s3cret-secret", From: from, ReceiptsURL: receipts, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				o := c.Send(context.Background(), m)
				if o.Kind != provider.Sent || o.HTTPStatus != http.StatusAccepted || o.Ref != "aaaaaaaa-bbbb-cccc-dddd-0123456789ab" {
					t.Errorf("from %q, receipts %q: outcome %+v, want Sent 202 with the document's message_uuid", from, receipts, o)
				}
			}
		}
	}
	xs := exchanges()
	if len(xs) != 12 {
		t.Fatalf("prism saw %d requests, want 12", len(xs))
	}
	for _, x := range xs {
		if v := x.requestViolations(); len(v) > 0 || x.status != http.StatusAccepted {
			t.Errorf("request %s: status %d, violations %+v", x.body, x.status, v)
		}
	}

	// Each error the document defines for the send, with its example body.
	tests := []struct {
		prefer string
		want   provider.Kind
		status int
	}{
		{"code=401", provider.Permanent, 401},
		{"code=402", provider.Retry, 402},
		{"code=422", provider.Permanent, 422},
		{"code=429", provider.Retry, 429},
		{"code=500", provider.Ambiguous, 500},
	}
	c, err := provider.NewVonage(provider.VonageConfig{BaseURL: base, APIKey: "abcd1234", APISecret: "s3cret-secret", From: "Acme", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		prefer(tt.prefer)
		o := c.Send(context.Background(), testMsg)
		if o.Kind != tt.want || o.HTTPStatus != tt.status || o.Reason == "" || o.Reason == http.StatusText(tt.status) {
			t.Errorf("%s: outcome %+v, want %v with the document's error title as reason", tt.prefer, o, tt.want)
		}
		assertNoSecrets(t, o)
	}
	for _, x := range exchanges()[12:] {
		if v := x.requestViolations(); len(v) > 0 {
			t.Errorf("request %s: violations %+v", x.body, v)
		}
	}
}

// The mock does validate: a request the document does not allow is
// answered 422 with its violations, and the published document, erratum
// included, refuses the adapter's requests for the lack of "message" (so
// the erratum is what the test corrects, and all it corrects).
func TestPrismValidatesVonageRequests(t *testing.T) {
	t.Parallel()
	base, _, exchanges := startPrism(t, correctedSpec(t), vonageServer(t).Path)
	post := func(body string) {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("abcd1234", "s3cret-secret")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	post(`{"message_type":"text","channel":"sms","from":"Acme","text":"no to"}`)
	post(`{"message_type":"text","channel":"sms","to":"1555","from":"Acme","text":"to too short"}`)
	post(`{"message_type":"text","channel":"sms","to":"15551234567","from":"Acme"}`)
	for _, x := range exchanges() {
		if x.status != http.StatusUnprocessableEntity || len(x.requestViolations()) == 0 {
			t.Errorf("invalid request %s: status %d, violations %+v; want 422 with violations", x.body, x.status, x.violations)
		}
	}

	published, _, pubExchanges := startPrism(t, vonageSpec, vonageServer(t).Path)
	c, err := provider.NewVonage(provider.VonageConfig{BaseURL: published, APIKey: "abcd1234", APISecret: "s3cret-secret", From: "Acme", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if o := send(t, c); o.Kind != provider.Permanent || o.HTTPStatus != http.StatusUnprocessableEntity {
		t.Errorf("at the published document: outcome %+v, want its 422", o)
	}
	xs := pubExchanges()
	if len(xs) != 1 {
		t.Fatalf("prism saw %d requests, want 1", len(xs))
	}
	// Every branch of the oneOf but SMS fails on channel or message type
	// as well; the SMS branch fails on "message" alone.
	var missing bool
	for _, v := range xs[0].requestViolations() {
		if v.Code == "required" && strings.Contains(v.Message, "'message'") {
			missing = true
		}
		if v.Code == "invalid security scheme" || fmt.Sprint(v.Code) == "401" {
			t.Errorf("the published document refused the adapter's credentials: %+v", v)
		}
		if v.Code == "required" && !strings.Contains(v.Message, "'message'") && strings.Contains(v.Message, "'text'") {
			t.Errorf("the published document says the text is missing: %+v", v)
		}
	}
	if !missing {
		t.Errorf("the published document refused the request, but not for the lack of message: %+v", xs[0].violations)
	}
}
