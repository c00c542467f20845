package provider_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
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

// sinchSpec is Sinch's published OpenAPI document of its SMS REST API
// (testdata/sinch/README.md says where it comes from).
const sinchSpec = "testdata/sinch/sms.yaml"

// The document is the one testdata/sinch/README.md names, unchanged.
func TestSinchSpecIsThePublishedOne(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(sinchSpec)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(filepath.Dir(sinchSpec), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := fmt.Sprintf("%x", sha256.Sum256(doc)); !bytes.Contains(readme, []byte("| sha256 | `"+sum+"` |")) {
		t.Errorf("%s has sha256 %s, which its README does not give: say where the new one comes from", sinchSpec, sum)
	}
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
	base, prefer, exchanges := startPrismAt(t, sinchSpec, "")
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
	base, _, exchanges := startPrismAt(t, sinchSpec, "")
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
	do(http.MethodGet, "/xms/v1/plan1/batches?"+url.Values{"page_size": {"500"}}.Encode(), "")
	xs := exchanges()
	if len(xs) != 6 {
		t.Fatalf("prism saw %d requests, want 6", len(xs))
	}
	for i, x := range xs {
		if x.status < 400 || (len(x.requestViolations()) == 0 && !strings.Contains(answers[i], `"validation":[{"location":["query"`)) {
			t.Errorf("invalid request %q: status %d, violations %+v, answer %s; want a refusal with violations", x.body, x.status, x.violations, answers[i])
		}
	}
}
