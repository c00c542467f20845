package provider_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sendonce/sendonce/internal/provider"
)

// A lookup that cannot be made is ErrNoLookup wherever it is found out:
// asked of a client without lookups, refused by an adapter whose provider
// offers none, and named with the provider's setting by the settings. Each
// adapter's refusal is still its own error, and not the other's, and a
// lookup cut short is ErrLookupIncomplete, not ErrNoLookup.
func TestErrNoLookup(t *testing.T) {
	t.Parallel()
	c, err := provider.New(provider.Config{BaseURL: "https://sms.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Lookup(context.Background(), provider.LookupQuery{Reference: "r"}); !errors.Is(r.Err, provider.ErrNoLookup) || r.Err.Error() != "lookup not enabled" {
		t.Errorf("lookup without lookups: %v, want ErrNoLookup", r.Err)
	}
	_, vonage := provider.NewVonage(provider.VonageConfig{APIKey: "k", APISecret: "s", From: "A", Lookup: true})
	_, telnyx := provider.NewTelnyx(provider.TelnyxConfig{APIKey: "k", From: "A", Lookup: true})
	for _, tt := range []struct {
		err      error
		own, not error
	}{
		{vonage, provider.ErrVonageNoLookup, provider.ErrTelnyxNoLookup},
		{telnyx, provider.ErrTelnyxNoLookup, provider.ErrVonageNoLookup},
	} {
		if !errors.Is(tt.err, provider.ErrNoLookup) || !errors.Is(tt.err, tt.own) || errors.Is(tt.err, tt.not) || tt.err.Error() != tt.own.Error() {
			t.Errorf("refusal %v: want ErrNoLookup and %v only", tt.err, tt.own)
		}
	}
	if errors.Is(provider.ErrLookupIncomplete, provider.ErrNoLookup) || errors.Is(provider.ErrNoLookup, provider.ErrLookupIncomplete) {
		t.Error("ErrLookupIncomplete and ErrNoLookup match each other")
	}

	s := provider.Settings{Kind: "telnyx", TelnyxKey: "k", TelnyxFrom: "A", Lookup: true}
	if _, err := s.Client(1); !errors.Is(err, provider.ErrTelnyxNoLookup) || err.Error() != "SMS_PROVIDER=telnyx: "+provider.ErrTelnyxNoLookup.Error() {
		t.Errorf("settings with telnyx and lookups: %v", err)
	}
}
