package provider_test

import (
	"errors"
	"testing"

	"github.com/sendonce/sendonce/internal/provider"
)

// Each adapter refuses a Config with the first of its broken settings,
// named in the words its documentation and the commands' errors use; the
// refusals of a lookup are errors a caller matches.
func TestAdapterConfigErrors(t *testing.T) {
	t.Parallel()
	twilio := func(c provider.TwilioConfig) error { _, err := provider.NewTwilio(c); return err }
	vonage := func(c provider.VonageConfig) error { _, err := provider.NewVonage(c); return err }
	sinch := func(c provider.SinchConfig) error { _, err := provider.NewSinch(c); return err }
	telnyx := func(c provider.TelnyxConfig) error { _, err := provider.NewTelnyx(c); return err }
	for _, tt := range []struct {
		err  error
		want string
	}{
		{twilio(provider.TwilioConfig{}), "provider: twilio AccountSID is required"},
		{twilio(provider.TwilioConfig{AccountSID: "AC1"}), "provider: twilio AuthToken is required"},
		{twilio(provider.TwilioConfig{AccountSID: "AC1", AuthToken: "t"}), "provider: twilio From or MessagingServiceSID is required"},
		{twilio(provider.TwilioConfig{AccountSID: "AC/1", AuthToken: "t", MessagingServiceSID: "MG1"}), "provider: twilio AccountSID is malformed"},
		{twilio(provider.TwilioConfig{AccountSID: "AC1", AuthToken: "t", From: "A", LookupPageSize: -1}), "provider: twilio LookupPageSize must be 1 to 1000"},
		{twilio(provider.TwilioConfig{AccountSID: "AC1", AuthToken: "t", From: "A", LookupPages: -1}), "provider: twilio LookupPages must be positive"},
		{twilio(provider.TwilioConfig{AccountSID: "AC1", AuthToken: "t", From: "A", BaseURL: "ftp://x"}), "provider: BaseURL must be an absolute http or https URL"},
		{vonage(provider.VonageConfig{Lookup: true}), "provider: vonage APIKey is required"},
		{vonage(provider.VonageConfig{APIKey: "k"}), "provider: vonage APISecret is required"},
		{vonage(provider.VonageConfig{APIKey: "k", APISecret: "s"}), "provider: vonage From is required"},
		{vonage(provider.VonageConfig{APIKey: "k", APISecret: "s", From: "A", MaxConns: -1}), "provider: MaxConns must be at least 1"},
		{sinch(provider.SinchConfig{}), "provider: sinch ServicePlanID is required"},
		{sinch(provider.SinchConfig{ServicePlanID: "p"}), "provider: sinch APIToken is required"},
		{sinch(provider.SinchConfig{ServicePlanID: "p", APIToken: "t"}), "provider: sinch From is required"},
		{sinch(provider.SinchConfig{ServicePlanID: "p%2F", APIToken: "t", From: "A"}), "provider: sinch ServicePlanID is malformed"},
		{sinch(provider.SinchConfig{ServicePlanID: "p", APIToken: "t", From: "A", LookupPageSize: 101}), "provider: sinch LookupPageSize must be 1 to 100"},
		{sinch(provider.SinchConfig{ServicePlanID: "p", APIToken: "t", From: "A", LookupPages: -1}), "provider: sinch LookupPages must be positive"},
		{sinch(provider.SinchConfig{ServicePlanID: "p", APIToken: "t", From: "A", ReceiptsURL: "receipts"}), "provider: ReceiptsURL must be an absolute http or https URL"},
		{telnyx(provider.TelnyxConfig{Lookup: true}), "provider: telnyx APIKey is required"},
		{telnyx(provider.TelnyxConfig{APIKey: "k"}), "provider: telnyx From or MessagingProfileID is required"},
		{telnyx(provider.TelnyxConfig{APIKey: "k", MessagingProfileID: "p", Timeout: -1}), "provider: timeouts must be positive"},
	} {
		if tt.err == nil || tt.err.Error() != tt.want {
			t.Errorf("error %v, want %q", tt.err, tt.want)
		}
	}
	if err := vonage(provider.VonageConfig{APIKey: "k", APISecret: "s", From: "A", Lookup: true}); !errors.Is(err, provider.ErrVonageNoLookup) {
		t.Errorf("vonage with Lookup: %v, want ErrVonageNoLookup", err)
	}
	if err := telnyx(provider.TelnyxConfig{APIKey: "k", From: "A", Lookup: true}); !errors.Is(err, provider.ErrTelnyxNoLookup) {
		t.Errorf("telnyx with Lookup: %v, want ErrTelnyxNoLookup", err)
	}
}
