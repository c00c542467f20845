package provider_test

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

// twilioRequest is what the Twilio test server received.
type twilioRequest struct {
	method, path, auth, contentType, key string
	form                                 url.Values
}

func startTwilio(t *testing.T, respond http.HandlerFunc) (string, func() []twilioRequest) {
	t.Helper()
	var (
		mu   sync.Mutex
		reqs []twilioRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		form, _ := url.ParseQuery(string(body))
		mu.Lock()
		reqs = append(reqs, twilioRequest{r.Method, r.URL.EscapedPath(), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), form})
		mu.Unlock()
		respond(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []twilioRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]twilioRequest(nil), reqs...)
	}
}

func TestTwilioRequestShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		cfg      provider.TwilioConfig
		wantForm url.Values
	}{
		{name: "from", cfg: provider.TwilioConfig{AccountSID: "AC123", AuthToken: "tok", From: "+15550001111"},
			wantForm: url.Values{"To": {testMsg.To}, "Body": {testMsg.Body}, "From": {"+15550001111"}}},
		{name: "messaging service", cfg: provider.TwilioConfig{AccountSID: "AC123", AuthToken: "tok", From: "+15550001111", MessagingServiceSID: "MG9"},
			wantForm: url.Values{"To": {testMsg.To}, "Body": {testMsg.Body}, "MessagingServiceSid": {"MG9"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base, requests := startTwilio(t, reply(201, `{"sid":"SM0123","status":"queued","id":"not-this"}`))
			tt.cfg.BaseURL = base + "/"
			c, err := provider.NewTwilio(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if c.Idempotent() {
				t.Error("the Twilio client claims idempotency")
			}
			o := send(t, c)
			if o.Kind != provider.Sent || o.Ref != "SM0123" {
				t.Errorf("outcome %+v, want Sent with the sid as Ref", o)
			}
			reqs := requests()
			if len(reqs) != 1 {
				t.Fatalf("server got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.method != http.MethodPost || r.path != "/2010-04-01/Accounts/AC123/Messages.json" {
				t.Errorf("request %s %s", r.method, r.path)
			}
			if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("AC123:tok")); r.auth != want {
				t.Errorf("Authorization = %q, want %q", r.auth, want)
			}
			if r.contentType != "application/x-www-form-urlencoded" {
				t.Errorf("Content-Type = %q", r.contentType)
			}
			if r.key != "" {
				t.Errorf("Idempotency-Key %q sent to a provider that ignores it", r.key)
			}
			if r.form.Encode() != tt.wantForm.Encode() {
				t.Errorf("form = %v, want %v", r.form, tt.wantForm)
			}
		})
	}
}

func TestTwilioClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		body   string
		want   provider.Kind
		code   int
	}{
		{"created", 201, `{"sid":"SM1"}`, provider.Sent, 0},
		{"invalid To echoed", 400, `{"code":21211,"message":"The 'To' number +15551234567 is not a valid phone number.","more_info":"https://www.twilio.com/docs/errors/21211","status":400}`, provider.Permanent, 21211},
		{"unsubscribed", 400, `{"code":21610,"message":"Attempt to send to unsubscribed recipient","status":400}`, provider.Permanent, 21610},
		// Twilio may have taken a message it answered 500: the status's
		// doubt wins over the code.
		{"unsubscribed on 500", 500, `{"code":21610,"message":"Attempt to send to unsubscribed recipient","status":500}`, provider.Ambiguous, 21610},
		{"server error", 500, `{"code":20500,"message":"Internal Server Error","status":500}`, provider.Ambiguous, 20500},
		{"rate limited", 429, `{"code":20429,"message":"Too Many Requests","status":429}`, provider.Retry, 20429},
		{"bad credentials", 401, `{"code":20003,"message":"Authenticate","status":401}`, provider.Permanent, 20003},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base, requests := startTwilio(t, reply(tt.status, tt.body))
			c, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: base, AccountSID: "AC1", AuthToken: "tok", From: "+15550001111", Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			o := send(t, c)
			if o.Kind != tt.want || o.Code != tt.code || o.HTTPStatus != tt.status {
				t.Errorf("outcome %+v, want %v with code %d", o, tt.want, tt.code)
			}
			if n := len(requests()); n != 1 {
				t.Errorf("server got %d requests, want 1", n)
			}
			assertNoSecrets(t, o)
		})
	}
}

func TestNewTwilioValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  provider.TwilioConfig
		want string
	}{
		{"valid", provider.TwilioConfig{AccountSID: "AC1", AuthToken: "s3cret", From: "+15550001111"}, ""},
		{"service instead of from", provider.TwilioConfig{AccountSID: "AC1", AuthToken: "s3cret", MessagingServiceSID: "MG1"}, ""},
		{"no account", provider.TwilioConfig{AuthToken: "s3cret", From: "x"}, "AccountSID"},
		{"no token", provider.TwilioConfig{AccountSID: "AC1", From: "x"}, "AuthToken"},
		{"no sender", provider.TwilioConfig{AccountSID: "AC1", AuthToken: "s3cret"}, "From"},
		{"account with a slash", provider.TwilioConfig{AccountSID: "AC1/../x", AuthToken: "s3cret", From: "x"}, "AccountSID"},
		{"bad base URL", provider.TwilioConfig{BaseURL: "api.twilio.com", AccountSID: "AC1", AuthToken: "s3cret", From: "x"}, "BaseURL"},
		{"page size above Twilio's", provider.TwilioConfig{AccountSID: "AC1", AuthToken: "s3cret", From: "x", LookupPageSize: 1001}, "LookupPageSize"},
		{"negative page cap", provider.TwilioConfig{AccountSID: "AC1", AuthToken: "s3cret", From: "x", LookupPages: -1}, "LookupPages"},
	}
	for _, tt := range tests {
		_, err := provider.NewTwilio(tt.cfg)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: NewTwilio: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: NewTwilio error = %v, want one naming %s", tt.name, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %q holds the token", tt.name, err)
		}
	}
}
