package provider_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
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

// vonageRequest is what the Vonage test server received.
type vonageRequest struct {
	method, path, auth, contentType, key string
	body                                 map[string]any
}

func startVonage(t *testing.T, respond http.HandlerFunc) (string, func() []vonageRequest) {
	t.Helper()
	var (
		mu   sync.Mutex
		reqs []vonageRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		mu.Lock()
		reqs = append(reqs, vonageRequest{r.Method, r.URL.EscapedPath(), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), body})
		mu.Unlock()
		respond(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []vonageRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]vonageRequest(nil), reqs...)
	}
}

func TestVonageRequestShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		receipts string
		from     string
		want     map[string]any
	}{
		{name: "no receipts", from: "+15550001111", want: map[string]any{
			"message_type": "text", "channel": "sms", "to": "15551234567", "from": "15550001111",
			"text": testMsg.Body, "client_ref": testMsg.Key}},
		{name: "receipts", receipts: "https://receipts.example.com/", from: "Acme", want: map[string]any{
			"message_type": "text", "channel": "sms", "to": "15551234567", "from": "Acme",
			"text": testMsg.Body, "client_ref": testMsg.Key,
			"webhook_url": "https://receipts.example.com/v1/receipts/vonage", "webhook_version": "v1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base, requests := startVonage(t, reply(202, `{"message_uuid":"aaaaaaaa-bbbb-cccc-dddd-0123456789ab"}`))
			c, err := provider.NewVonage(provider.VonageConfig{BaseURL: base + "/", APIKey: "key1", APISecret: "s3cret", From: tt.from, ReceiptsURL: tt.receipts})
			if err != nil {
				t.Fatal(err)
			}
			if c.Idempotent() || c.CanLookup() {
				t.Errorf("the Vonage client claims idempotency (%v) or lookups (%v)", c.Idempotent(), c.CanLookup())
			}
			o := send(t, c)
			if o.Kind != provider.Sent || o.Ref != "aaaaaaaa-bbbb-cccc-dddd-0123456789ab" || o.HTTPStatus != 202 {
				t.Errorf("outcome %+v, want Sent with the message_uuid as Ref", o)
			}
			reqs := requests()
			if len(reqs) != 1 {
				t.Fatalf("server got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.method != http.MethodPost || r.path != "/v1/messages" {
				t.Errorf("request %s %s, want POST /v1/messages", r.method, r.path)
			}
			if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("key1:s3cret")); r.auth != want {
				t.Errorf("Authorization = %q, want %q", r.auth, want)
			}
			if r.contentType != "application/json" {
				t.Errorf("Content-Type = %q", r.contentType)
			}
			if r.key != "" {
				t.Errorf("Idempotency-Key %q sent to a provider that ignores it", r.key)
			}
			got, _ := json.Marshal(r.body)
			want, _ := json.Marshal(tt.want)
			if string(got) != string(want) {
				t.Errorf("body %s, want %s", got, want)
			}
		})
	}
}

func TestVonageClassification(t *testing.T) {
	t.Parallel()
	body := func(frag, title, detail string) string {
		b, _ := json.Marshal(map[string]string{"type": "https://developer.nexmo.com/api-errors/messages-olympus#" + frag, "title": title, "detail": detail, "instance": "bf0ca0bf927b3b52e3cb03217e1a1ddf"})
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
	}{
		{name: "accepted", status: 202, body: `{"message_uuid":"aaaaaaaa-bbbb-cccc-dddd-0123456789ab"}`, want: provider.Sent},
		{name: "bad credentials", status: 401, body: `{"type":"https://developer.nexmo.com/api-errors/#unathorized","title":"You did not provide correct credentials.","detail":"Check that you're using the correct credentials, and that your account has this feature enabled","instance":"bf0c"}`, want: provider.Permanent},
		{name: "low balance", status: 402, body: `{"type":"https://developer.nexmo.com/api-errors/#low-balance","title":"Low balance","detail":"This request could not be performed due to your account balance being low.","instance":"bf0c"}`, want: provider.Retry},
		{name: "invalid recipient echoed", status: 422, body: body("1130", "Invalid recipient", "The `to` parameter +15551234567 is invalid for the given channel."), want: provider.Permanent, code: 1130},
		{name: "invalid sender", status: 422, body: body("1120", "Invalid sender", "The `from` parameter is invalid for the given channel."), want: provider.Permanent, code: 1120},
		{name: "throttled", status: 429, body: body("1000", "Rate Limit Hit", "Please wait, then retry your request"), header: []string{"Retry-After", "7"}, want: provider.Retry, code: 1000, after: 7 * time.Second},
		{name: "internal error", status: 500, body: body("1000", "Internal error", "There was an error processing your request in the Platform."), want: provider.Ambiguous, code: 1000, maybe: true},
		{name: "bad gateway, not JSON", status: 502, body: `<html>bad gateway</html>`, want: provider.Ambiguous, maybe: true},
		{name: "proxy timeout", status: 408, body: ``, want: provider.Ambiguous, maybe: true},
		{name: "not found", status: 404, body: `{}`, want: provider.Permanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base, requests := startVonage(t, reply(tt.status, tt.body, tt.header...))
			c, err := provider.NewVonage(provider.VonageConfig{BaseURL: base, APIKey: "key1", APISecret: "s3cret", From: "Acme", Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			o := send(t, c)
			if o.Kind != tt.want || o.Code != tt.code || o.HTTPStatus != tt.status || o.MaybeAccepted != tt.maybe || o.After != tt.after {
				t.Errorf("outcome %+v, want %v code %d maybe-accepted %v after %s", o, tt.want, tt.code, tt.maybe, tt.after)
			}
			if n := len(requests()); n != 1 {
				t.Errorf("server got %d requests, want 1", n)
			}
			assertNoSecrets(t, o)
			if strings.Contains(o.Reason, "s3cret") {
				t.Errorf("reason %q holds the secret", o.Reason)
			}
		})
	}
}

// A number that is not E.164 digits is refused before anything is sent,
// and the refusal does not hold it.
func TestVonageRefusesMalformedNumbers(t *testing.T) {
	t.Parallel()
	base, requests := startVonage(t, reply(202, `{"message_uuid":"u1"}`))
	c, err := provider.NewVonage(provider.VonageConfig{BaseURL: base, APIKey: "key1", APISecret: "s3cret", From: "Acme"})
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"+1555", "+0015551234567", "+1555123456789012", "+1 555 123 4567", "15551234567x"} {
		o := c.Send(context.Background(), provider.Message{Key: testMsg.Key, To: to, Body: testMsg.Body})
		if o.Kind != provider.Permanent || strings.Contains(o.Reason, strings.TrimPrefix(to, "+")) {
			t.Errorf("to %q: outcome %+v, want Permanent without the number", to, o)
		}
	}
	if n := len(requests()); n != 0 {
		t.Errorf("server got %d requests, want none", n)
	}
}

func TestNewVonageValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  provider.VonageConfig
		want string
	}{
		{"valid", provider.VonageConfig{APIKey: "k", APISecret: "s3cret", From: "Acme"}, ""},
		{"no key", provider.VonageConfig{APISecret: "s3cret", From: "Acme"}, "APIKey"},
		{"no secret", provider.VonageConfig{APIKey: "k", From: "Acme"}, "APISecret"},
		{"no sender", provider.VonageConfig{APIKey: "k", APISecret: "s3cret"}, "From"},
		{"lookup", provider.VonageConfig{APIKey: "k", APISecret: "s3cret", From: "Acme", Lookup: true}, "no lookup"},
		{"bad base URL", provider.VonageConfig{BaseURL: "api.nexmo.com", APIKey: "k", APISecret: "s3cret", From: "Acme"}, "BaseURL"},
	}
	for _, tt := range tests {
		_, err := provider.NewVonage(tt.cfg)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: NewVonage: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: NewVonage error = %v, want one naming %s", tt.name, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %q holds the secret", tt.name, err)
		}
	}
	if _, err := provider.NewVonage(provider.VonageConfig{APIKey: "k", APISecret: "s", From: "A", Lookup: true}); !errors.Is(err, provider.ErrVonageNoLookup) {
		t.Errorf("lookup refused with %v, want ErrVonageNoLookup", err)
	}
}

// SMS_PROVIDER=vonage: its settings are required, and SMS_API_LOOKUP=true
// stops the start naming the setting.
func TestVonageSettings(t *testing.T) {
	t.Parallel()
	base := map[string]string{"SMS_PROVIDER": "vonage", "VONAGE_API_KEY": "k", "VONAGE_API_SECRET": "s3cret", "VONAGE_FROM": "Acme"}
	tests := []struct {
		name string
		edit map[string]string
		want string
	}{
		{"valid", nil, ""},
		{"no key", map[string]string{"VONAGE_API_KEY": ""}, "VONAGE_API_KEY"},
		{"no secret", map[string]string{"VONAGE_API_SECRET": ""}, "VONAGE_API_SECRET"},
		{"no sender", map[string]string{"VONAGE_FROM": ""}, "VONAGE_FROM"},
		{"lookup", map[string]string{"SMS_API_LOOKUP": "true"}, "SMS_API_LOOKUP"},
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
			continue
		}
		cl, err := c.Client(4)
		if err != nil {
			t.Fatalf("%s: Client: %v", tt.name, err)
		}
		if cl.Idempotent() || cl.CanLookup() || c.LooksUp() {
			t.Errorf("%s: a Vonage client that is idempotent or looks up", tt.name)
		}
		// relay resolve asks for lookups after the settings were read.
		c.Lookup = true
		if _, err := c.Client(4); err == nil || !strings.Contains(err.Error(), "vonage") {
			t.Errorf("%s: a Vonage client with lookups: %v, want a refusal", tt.name, err)
		}
	}
}
