package provider_test

import (
	"testing"

	"github.com/sendonce/sendonce/internal/provider"
)

// Only what a provider certainly did not take may go to another provider:
// a request that never left, at any provider; a 503 where the API's
// contract says it takes nothing (the generic API), not elsewhere; a
// refusal the provider documents (Vonage's 402); never a lost answer.
func TestNotTakenIsWhatTheProviderDocuments(t *testing.T) {
	generic, err := provider.New(provider.Config{BaseURL: "https://sms.example", Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	twilio, err := provider.NewTwilio(provider.TwilioConfig{AccountSID: "AC1", AuthToken: "t", From: "+15550001111"})
	if err != nil {
		t.Fatal(err)
	}
	vonage, err := provider.NewVonage(provider.VonageConfig{APIKey: "k", APISecret: "s", From: "+15550001111"})
	if err != nil {
		t.Fatal(err)
	}
	sinch, err := provider.NewSinch(provider.SinchConfig{ServicePlanID: "p", APIToken: "t", From: "+15550001111"})
	if err != nil {
		t.Fatal(err)
	}
	telnyx, err := provider.NewTelnyx(provider.TelnyxConfig{APIKey: "k", From: "+15550001111"})
	if err != nil {
		t.Fatal(err)
	}
	neverLeft := provider.Outcome{Kind: provider.Retry, Reason: "request not sent: connection refused"}
	unavailable := provider.Outcome{Kind: provider.Retry, HTTPStatus: 503}
	lowBalance := provider.Outcome{Kind: provider.Retry, HTTPStatus: 402}
	lost := provider.Outcome{Kind: provider.Ambiguous, MaybeAccepted: true}
	lostIdem := provider.Outcome{Kind: provider.Retry, MaybeAccepted: true}
	// An idempotent client's timeout on a live connection that raced the
	// report of the request written: not maybe-accepted for its own
	// retries, but not certain enough to go elsewhere.
	racedIdem := provider.Outcome{Kind: provider.Retry, Connected: true, Reason: "request not sent: timeout"}
	for _, tt := range []struct {
		name string
		c    *provider.Client
		o    provider.Outcome
		want bool
	}{
		{"generic, never left", generic, neverLeft, true},
		{"generic, 503", generic, unavailable, true},
		{"generic, answer lost", generic, lostIdem, false},
		{"generic, timeout on a live connection", generic, racedIdem, false},
		{"twilio, never left", twilio, neverLeft, true},
		{"twilio, 503", twilio, unavailable, false},
		{"twilio, answer lost", twilio, lost, false},
		{"vonage, 402", vonage, lowBalance, true},
		{"vonage, 503", vonage, unavailable, false},
		{"sinch, 503", sinch, unavailable, false},
		{"sinch, never left", sinch, neverLeft, true},
		{"telnyx, 503", telnyx, unavailable, false},
		{"telnyx, never left", telnyx, neverLeft, true},
	} {
		if got := tt.c.NotTaken(tt.o); got != tt.want {
			t.Errorf("%s: NotTaken = %v, want %v", tt.name, got, tt.want)
		}
	}
}
