package provider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

// expiryAdapters are a client of every kind pointed at base: the generic
// API (with and without idempotency) and each provider's adapter.
func expiryAdapters(t *testing.T, base string) map[string]*provider.Client {
	t.Helper()
	out := map[string]*provider.Client{
		"generic idempotent":     newClient(t, base, true, nil),
		"generic not idempotent": newClient(t, base, false, nil),
	}
	var err error
	if out["twilio"], err = provider.NewTwilio(provider.TwilioConfig{BaseURL: base, AccountSID: twilioAccount, AuthToken: "tok",
		From: "+15550001111", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if out["vonage"], err = provider.NewVonage(provider.VonageConfig{BaseURL: base, APIKey: "key", APISecret: "secret",
		From: "Acme", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if out["sinch"], err = provider.NewSinch(provider.SinchConfig{BaseURL: base, ServicePlanID: "plan", APIToken: "tok",
		From: "Acme", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if out["telnyx"], err = provider.NewTelnyx(provider.TelnyxConfig{BaseURL: base, APIKey: "key",
		From: "+15550001111", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	return out
}

// A message whose expiry has passed, or is now, when the request would be
// built is not sent at all, by any adapter: no request reaches the
// provider, and the outcome is Expired, certainly not taken (no status, no
// connection, not MaybeAccepted), with a reason that says so. It does not
// move to another provider either (NotTaken is for a message another
// provider may still send; an expired one no provider may). A message
// with time left is sent.
func TestSendNothingPastTheExpiry(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"generic idempotent", "generic not idempotent", "twilio", "vonage", "sinch", "telnyx"} {
		// Each provider's success, near enough: every adapter reads its
		// message id from one of these fields.
		p := startProvider(t, reply(http.StatusCreated, `{"id":"m1","sid":"SM1","message_uuid":"u1","data":{"id":"t1"}}`))
		c := expiryAdapters(t, p.URL)[name]
		for _, tt := range []struct {
			name      string
			expiresAt time.Time
		}{
			{"an hour ago", time.Now().Add(-time.Hour)},
			{"a nanosecond ago", time.Now().Add(-time.Nanosecond)},
			// Now, as the test knows it, is in the past by the time Send
			// reads the clock: at the expiry, no call starts.
			{"now", time.Now()},
		} {
			m := testMsg
			m.ExpiresAt = tt.expiresAt
			o := c.Send(context.Background(), m)
			if o.Kind != provider.Expired || o.HTTPStatus != 0 || o.MaybeAccepted || o.Connected || o.Code != 0 || o.Ref != "" ||
				o.Reason != "not sent: the message expired before the request left" {
				t.Errorf("%s, expiry %s: outcome %+v, want Expired, nothing sent", name, tt.name, o)
			}
			if c.NotTaken(o) {
				t.Errorf("%s, expiry %s: NotTaken, which would move an expired message to another provider", name, tt.name)
			}
			if o.Error() != o.Reason {
				t.Errorf("%s: Error() = %q", name, o.Error())
			}
			assertNoSecrets(t, o)
		}
		if n := len(p.requests()); n != 0 {
			t.Fatalf("%s: the provider got %d requests for expired messages, want none", name, n)
		}
		m := testMsg
		m.ExpiresAt = time.Now().Add(time.Hour)
		if o := c.Send(context.Background(), m); o.Kind != provider.Sent {
			t.Errorf("%s, an hour left: outcome %+v, want Sent", name, o)
		}
		if n := len(p.requests()); n != 1 {
			t.Fatalf("%s: the provider got %d requests for a message with time left, want 1", name, n)
		}
	}
}

// The generic API is told the expiry as expires_at (RFC 3339, UTC), the
// same bytes on every attempt of the message, so that a provider that
// compares the bodies of one key finds them equal; a message without an
// expiry has no expires_at.
func TestSendTellsTheGenericAPITheExpiry(t *testing.T) {
	t.Parallel()
	p := startProvider(t, reply(http.StatusCreated, `{"id":"msg_1"}`))
	c := newClient(t, p.URL, true, nil)
	m := testMsg
	m.ExpiresAt = time.Date(2100, 1, 2, 4, 4, 5, 678_900_000, time.FixedZone("CET", 3600))
	for range 2 {
		if o := c.Send(context.Background(), m); o.Kind != provider.Sent {
			t.Fatalf("Send: %+v", o)
		}
	}
	if o := c.Send(context.Background(), testMsg); o.Kind != provider.Sent {
		t.Fatalf("Send without an expiry: %+v", o)
	}
	reqs := p.requests()
	if len(reqs) != 3 || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
		t.Fatalf("%d requests; the two attempts' bodies differ", len(reqs))
	}
	for i, want := range []any{"2100-01-02T03:04:05.6789Z", nil} {
		var got map[string]any
		if err := json.Unmarshal(reqs[i+1].Body, &got); err != nil {
			t.Fatal(err)
		}
		if v, ok := got["expires_at"]; v != want || ok != (want != nil) {
			t.Errorf("request %d: expires_at %v (present %v), want %v", i+1, v, ok, want)
		}
	}
}

// Vonage's and Telnyx's send requests have no field for a message's
// validity in the documents the adapters follow (docs/providers.md,
// "Expiry"), so a message with an expiry is sent exactly as one without:
// the same bytes, nothing guessed.
func TestVonageAndTelnyxAreToldNoExpiry(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"vonage", "telnyx"} {
		p := startProvider(t, reply(http.StatusCreated, `{"message_uuid":"u1","data":{"id":"t1"}}`))
		c := expiryAdapters(t, p.URL)[name]
		m := testMsg
		m.ExpiresAt = time.Now().Add(time.Hour)
		for _, m := range []provider.Message{testMsg, m} {
			if o := c.Send(context.Background(), m); o.Kind != provider.Sent {
				t.Fatalf("%s: %+v", name, o)
			}
		}
		reqs := p.requests()
		if len(reqs) != 2 || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
			t.Errorf("%s: %d requests; the one with an expiry differs from the one without", name, len(reqs))
		}
	}
}
