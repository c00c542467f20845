package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/provider"
)

// telnyxRequest is what the Telnyx test server received.
type telnyxRequest struct {
	method, path, auth, contentType, key string
	raw                                  []byte
}

func startTelnyx(t *testing.T, respond http.HandlerFunc) (string, func() []telnyxRequest) {
	t.Helper()
	var (
		mu   sync.Mutex
		reqs []telnyxRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs = append(reqs, telnyxRequest{r.Method, r.URL.EscapedPath(), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), raw})
		mu.Unlock()
		respond(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []telnyxRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]telnyxRequest(nil), reqs...)
	}
}

// telnyxSent is a send's answer in the document's MessageResponse shape.
const telnyxSent = `{"data":{"record_type":"message","direction":"outbound","id":"40385f64-5717-4562-b3fc-2c963f66afa6","type":"SMS","to":[{"phone_number":"+15551234567","status":"queued"}],"text":"Your code is 482901","errors":[]}}`

func TestTelnyxRequestShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		receipts string
		from     string
		profile  string
		want     string
	}{
		{name: "number, no receipts", from: "+15550001111",
			want: `{"to":"+15551234567","from":"+15550001111","text":"Your code is 482901"}`},
		{name: "profile alone", profile: "4000eba1-a0c0-4563-9925-b25e842a7cb6",
			want: `{"to":"+15551234567","messaging_profile_id":"4000eba1-a0c0-4563-9925-b25e842a7cb6","text":"Your code is 482901"}`},
		{name: "sender id and profile, receipts", receipts: "https://receipts.example.com/", from: "Acme", profile: "4000eba1-a0c0-4563-9925-b25e842a7cb6",
			want: `{"to":"+15551234567","from":"Acme","messaging_profile_id":"4000eba1-a0c0-4563-9925-b25e842a7cb6","text":"Your code is 482901",` +
				`"webhook_url":"https://receipts.example.com/v1/receipts/telnyx?ref=0b9c6a52-7f0e-4d5c-9a43-2b1f8f1e6a10","use_profile_webhooks":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base, requests := startTelnyx(t, reply(200, telnyxSent))
			c, err := provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base + "/", APIKey: "KEY0123456789", From: tt.from, MessagingProfileID: tt.profile, ReceiptsURL: tt.receipts})
			if err != nil {
				t.Fatal(err)
			}
			if c.Idempotent() || c.CanLookup() {
				t.Errorf("the Telnyx client claims idempotency (%v) or lookups (%v)", c.Idempotent(), c.CanLookup())
			}
			o := send(t, c)
			if o.Kind != provider.Sent || o.Ref != "40385f64-5717-4562-b3fc-2c963f66afa6" || o.HTTPStatus != 200 {
				t.Errorf("outcome %+v, want Sent with data.id as Ref", o)
			}
			reqs := requests()
			if len(reqs) != 1 {
				t.Fatalf("server got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.method != http.MethodPost || r.path != "/v2/messages" {
				t.Errorf("request %s %s, want POST /v2/messages", r.method, r.path)
			}
			if r.auth != "Bearer KEY0123456789" {
				t.Errorf("Authorization = %q, want the key as a Bearer token", r.auth)
			}
			if r.contentType != "application/json" {
				t.Errorf("Content-Type = %q", r.contentType)
			}
			if r.key != "" {
				t.Errorf("Idempotency-Key %q sent to an operation that declares none", r.key)
			}
			if string(r.raw) != tt.want {
				t.Errorf("body %s, want %s", r.raw, tt.want)
			}
		})
	}
}

// The row id in webhook_url's query survives any reference: it is escaped.
func TestTelnyxReceiptsURL(t *testing.T) {
	t.Parallel()
	if got, want := provider.TelnyxReceiptsURL("https://r.example.com/base/", "a b&c"), "https://r.example.com/base/v1/receipts/telnyx?ref=a+b%26c"; got != want {
		t.Errorf("TelnyxReceiptsURL = %q, want %q", got, want)
	}
}

func TestTelnyxClassification(t *testing.T) {
	t.Parallel()
	body := func(code, title, detail string) string {
		b, _ := json.Marshal(map[string]any{"errors": []map[string]any{{"code": code, "title": title, "detail": detail,
			"meta": map[string]string{"url": "https://developers.telnyx.com/docs/overview/errors/" + code}}}})
		return string(b)
	}
	tests := []struct {
		name   string
		status int
		body   string
		header []string
		want   provider.Kind
		code   int
		maybe  bool
		after  time.Duration
		reason string
	}{
		{name: "sent", status: 200, body: telnyxSent, want: provider.Sent},
		{name: "bad request", status: 400, body: body("10015", "Bad Request", "The request failed because it was not well-formed."), want: provider.Permanent, code: 10015, reason: "Bad Request: The request failed"},
		{name: "invalid to, echoed", status: 400, body: body("40310", "Invalid 'to' address", "The 'to' address +15551234567 should be a single valid number."), want: provider.Permanent, code: 40310, reason: "Invalid 'to' address"},
		{name: "not +E.164", status: 400, body: body("10016", "Phone number must be in +E.164 format", ""), want: provider.Permanent, code: 10016, reason: "Phone number must be in +E.164 format"},
		{name: "authentication failed", status: 401, body: body("10009", "Authentication failed", "The required authentication headers were either invalid or not included in the request."), want: provider.Permanent, code: 10009},
		{name: "authorization failed", status: 403, body: body("10010", "Authorization failed", "You do not have permission to perform the requested action."), want: provider.Permanent, code: 10010},
		{name: "unprocessable", status: 422, body: body("40305", "Invalid 'from' address", "The 'from' address should be a valid number."), want: provider.Permanent, code: 40305},
		{name: "too many requests", status: 429, body: body("10011", "Too many requests", "You have exceeded the maximum number of allowed requests."), header: []string{"Retry-After", "7"}, want: provider.Retry, code: 10011, after: 7 * time.Second},
		{name: "unexpected error", status: 500, body: body("10007", "Unexpected error", "An unexpected error occured."), want: provider.Ambiguous, code: 10007, maybe: true},
		{name: "unavailable", status: 503, body: `upstream unavailable`, want: provider.Ambiguous},
		{name: "bad gateway, not JSON", status: 502, body: `<html>bad gateway</html>`, want: provider.Ambiguous, maybe: true},
		{name: "request timeout", status: 408, body: body("10008", "Request timeout", "The request timed out."), want: provider.Ambiguous, code: 10008, maybe: true},
		{name: "code not digits", status: 400, body: body("string", "string", "string"), want: provider.Permanent, reason: "string: string"},
		{name: "no errors list", status: 404, body: `{"errors":[]}`, want: provider.Permanent, reason: "Not Found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base, requests := startTelnyx(t, reply(tt.status, tt.body, tt.header...))
			c, err := provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base, APIKey: "KEY0123456789", From: "Acme", Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			o := send(t, c)
			if o.Kind != tt.want || o.Code != tt.code || o.HTTPStatus != tt.status || o.MaybeAccepted != tt.maybe || o.After != tt.after {
				t.Errorf("outcome %+v, want %v code %d maybe-accepted %v after %s", o, tt.want, tt.code, tt.maybe, tt.after)
			}
			if !strings.HasPrefix(o.Reason, tt.reason) {
				t.Errorf("reason %q, want it to start %q", o.Reason, tt.reason)
			}
			if n := len(requests()); n != 1 {
				t.Errorf("server got %d requests, want 1", n)
			}
			assertNoSecrets(t, o)
			if strings.Contains(o.Reason, "KEY0123456789") {
				t.Errorf("reason %q holds the key", o.Reason)
			}
		})
	}
}

// SMS_PERMANENT_CODES names Telnyx's codes: a code it names is permanent
// on an answer that took nothing (here a 429), never on one that may follow
// a message Telnyx took (a 5xx), where the status's doubt wins.
func TestTelnyxPermanentCodes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status int
		code   int
		want   provider.Kind
	}{
		{429, 10011, provider.Permanent},
		{500, 10007, provider.Ambiguous},
	} {
		base, _ := startTelnyx(t, reply(tt.status, fmt.Sprintf(`{"errors":[{"code":"%d","title":"Refused"}]}`, tt.code)))
		c, err := provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base, APIKey: "KEY0123456789", From: "Acme", PermanentCodes: []int{10007, 10011}})
		if err != nil {
			t.Fatal(err)
		}
		if o := send(t, c); o.Kind != tt.want || o.Code != tt.code {
			t.Errorf("%d with code %d: outcome %+v, want %v", tt.status, tt.code, o, tt.want)
		}
	}
}

// A number that is not E.164 digits is refused before anything is sent,
// and the refusal does not hold it.
func TestTelnyxRefusesMalformedNumbers(t *testing.T) {
	t.Parallel()
	base, requests := startTelnyx(t, reply(200, telnyxSent))
	c, err := provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base, APIKey: "KEY0123456789", From: "Acme"})
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"+1555", "+0015551234567", "+1555123456789012", "+1 555 123 4567", "15551234567x", ""} {
		o := c.Send(context.Background(), provider.Message{Key: testMsg.Key, To: to, Body: testMsg.Body})
		if o.Kind != provider.Permanent || (to != "" && strings.Contains(o.Reason, strings.TrimPrefix(to, "+"))) {
			t.Errorf("to %q: outcome %+v, want Permanent without the number", to, o)
		}
	}
	if n := len(requests()); n != 0 {
		t.Errorf("server got %d requests, want none", n)
	}
	// A number stored without its '+' is sent with it.
	o := c.Send(context.Background(), provider.Message{Key: testMsg.Key, To: "15551234567", Body: testMsg.Body})
	if reqs := requests(); o.Kind != provider.Sent || len(reqs) != 1 || !strings.Contains(string(reqs[0].raw), `"to":"+15551234567"`) {
		t.Errorf("outcome %+v, requests %d: want the number sent as +E.164", o, len(reqs))
	}
}

// An answer whose data.id cannot be read is still Sent (Telnyx took the
// message), without a Ref.
func TestTelnyxSentWithoutReadableID(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"id":"top-level-not-data"}`, `{"data":{"id":""}}`, `{"data":{"id":"has space"}}`, `not json`} {
		base, _ := startTelnyx(t, reply(200, body))
		c, err := provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base, APIKey: "KEY0123456789", From: "Acme"})
		if err != nil {
			t.Fatal(err)
		}
		if o := send(t, c); o.Kind != provider.Sent || o.Ref != "" {
			t.Errorf("answer %s: outcome %+v, want Sent without a Ref", body, o)
		}
	}
}

func TestNewTelnyxValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  provider.TelnyxConfig
		want string
	}{
		{"valid", provider.TelnyxConfig{APIKey: "KEYs3cret", From: "+15550001111"}, ""},
		{"profile alone", provider.TelnyxConfig{APIKey: "KEYs3cret", MessagingProfileID: "p1"}, ""},
		{"no key", provider.TelnyxConfig{From: "Acme"}, "APIKey"},
		{"no sender", provider.TelnyxConfig{APIKey: "KEYs3cret"}, "From or MessagingProfileID"},
		{"lookup", provider.TelnyxConfig{APIKey: "KEYs3cret", From: "Acme", Lookup: true}, "no lookup"},
		{"bad base URL", provider.TelnyxConfig{BaseURL: "api.telnyx.com", APIKey: "KEYs3cret", From: "Acme"}, "BaseURL"},
		{"bad receipts URL", provider.TelnyxConfig{APIKey: "KEYs3cret", From: "Acme", ReceiptsURL: "receipts.example.com"}, "ReceiptsURL"},
	}
	for _, tt := range tests {
		_, err := provider.NewTelnyx(tt.cfg)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: NewTelnyx: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: NewTelnyx error = %v, want one naming %s", tt.name, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %q holds the key", tt.name, err)
		}
	}
	if _, err := provider.NewTelnyx(provider.TelnyxConfig{APIKey: "k", From: "A", Lookup: true}); !errors.Is(err, provider.ErrTelnyxNoLookup) {
		t.Errorf("lookup refused with %v, want ErrTelnyxNoLookup", err)
	}
}

// telnyxSettings parses env as the sender's provider settings.
func telnyxSettings(env map[string]string) (provider.Settings, error) {
	var c provider.Settings
	var stderr strings.Builder
	s := envflag.New("test", func(k string) string { return env[k] }, &stderr)
	provider.BindSettings(s, &c)
	return c, s.Parse(nil)
}

// SMS_PROVIDER=telnyx: its settings are required, the key is secret, and
// SMS_API_LOOKUP=true stops the start naming the setting.
func TestTelnyxSettings(t *testing.T) {
	t.Parallel()
	base := map[string]string{"SMS_PROVIDER": "telnyx", "TELNYX_API_KEY": "KEYs3cret", "TELNYX_FROM": "+15550001111"}
	tests := []struct {
		name string
		edit map[string]string
		want string
	}{
		{"valid", nil, ""},
		{"profile instead of from", map[string]string{"TELNYX_FROM": "", "TELNYX_MESSAGING_PROFILE_ID": "p1"}, ""},
		{"no key", map[string]string{"TELNYX_API_KEY": ""}, "TELNYX_API_KEY"},
		{"no sender", map[string]string{"TELNYX_FROM": ""}, "TELNYX_FROM"},
		{"lookup", map[string]string{"SMS_API_LOOKUP": "true"}, "SMS_API_LOOKUP"},
		{"http base", map[string]string{"TELNYX_API_BASE": "http://127.0.0.1:9"}, "TELNYX_API_BASE"},
		{"http base allowed", map[string]string{"TELNYX_API_BASE": "http://127.0.0.1:9", "SMS_API_ALLOW_INSECURE": "true"}, ""},
		{"in the failover list without a key", map[string]string{"SMS_PROVIDER": "", "SMS_PROVIDERS": "generic,telnyx", "SMS_API_BASE": "https://sms.example.com", "TELNYX_API_KEY": ""}, "TELNYX_API_KEY is required with telnyx in SMS_PROVIDERS"},
	}
	for _, tt := range tests {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range tt.edit {
			env[k] = v
		}
		c, err := telnyxSettings(env)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
			continue
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: error = %v, want one naming %s", tt.name, err, tt.want)
			continue
		case tt.want != "":
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: error %q holds the key", tt.name, err)
			}
			continue
		}
		cl, err := c.Client(4)
		if err != nil {
			t.Fatalf("%s: Client: %v", tt.name, err)
		}
		if cl.Idempotent() || cl.CanLookup() || c.LooksUp() {
			t.Errorf("%s: a Telnyx client that is idempotent or looks up", tt.name)
		}
		// relay resolve asks for lookups after the settings were read.
		c.Lookup = true
		if _, err := c.Client(4); err == nil || !strings.Contains(err.Error(), "telnyx") {
			t.Errorf("%s: a Telnyx client with lookups: %v, want a refusal", tt.name, err)
		}
	}
}

// The settings reach the requests: SMS_API_BASE when telnyx is the only
// provider, TELNYX_API_BASE in a failover list (where SMS_API_BASE is the
// generic provider's), and the key, sender, profile and receipts URL.
func TestTelnyxSettingsReachTheRequest(t *testing.T) {
	t.Parallel()
	telnyx, requests := startTelnyx(t, reply(200, telnyxSent))
	generic, genericRequests := startTelnyx(t, reply(200, `{"id":"g1"}`))
	common := map[string]string{"TELNYX_API_KEY": "KEY0123456789", "TELNYX_FROM": "Acme", "TELNYX_MESSAGING_PROFILE_ID": "p1",
		"SMS_API_ALLOW_INSECURE": "true", "RECEIPTS_PUBLIC_URL": "https://receipts.example.com"}
	for _, tt := range []struct {
		name string
		env  map[string]string
	}{
		{"alone", map[string]string{"SMS_PROVIDER": "telnyx", "SMS_API_BASE": telnyx}},
		{"failover", map[string]string{"SMS_PROVIDERS": "generic,telnyx", "SMS_API_BASE": generic, "TELNYX_API_BASE": telnyx}},
	} {
		env := map[string]string{}
		for k, v := range common {
			env[k] = v
		}
		for k, v := range tt.env {
			env[k] = v
		}
		c, err := telnyxSettings(env)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		cls, err := c.Clients(4)
		if err != nil {
			t.Fatalf("%s: Clients: %v", tt.name, err)
		}
		last := cls[len(cls)-1]
		if last.Name != "telnyx" {
			t.Fatalf("%s: providers %+v, want telnyx last", tt.name, cls)
		}
		if o := send(t, last.Client); o.Kind != provider.Sent || o.Ref != "40385f64-5717-4562-b3fc-2c963f66afa6" {
			t.Errorf("%s: outcome %+v", tt.name, o)
		}
	}
	reqs := requests()
	if len(reqs) != 2 || len(genericRequests()) != 0 {
		t.Fatalf("telnyx got %d requests, generic %d; want 2 and 0", len(reqs), len(genericRequests()))
	}
	for _, r := range reqs {
		want := `{"to":"+15551234567","from":"Acme","messaging_profile_id":"p1","text":"Your code is 482901","webhook_url":"https://receipts.example.com/v1/receipts/telnyx?ref=0b9c6a52-7f0e-4d5c-9a43-2b1f8f1e6a10","use_profile_webhooks":false}`
		if r.path != "/v2/messages" || r.auth != "Bearer KEY0123456789" || string(r.raw) != want {
			t.Errorf("request %s %s %s, want POST /v2/messages with the key and %s", r.path, r.auth, r.raw, want)
		}
	}
}
