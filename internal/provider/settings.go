package provider

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
)

// DefaultLookupSettle is SMS_API_LOOKUP_SETTLE's default.
const DefaultLookupSettle = 10 * time.Second

// DefaultLookupRetention is SMS_API_LOOKUP_RETENTION's default: how long a
// provider is assumed to keep a message it accepted visible to lookups. A
// lookup that finds nothing proves nothing about an attempt older than
// that, so the shorter the assumption, the fewer such answers are trusted.
// 24 hours is the retention of the generic contract as sendonce knows it
// (the stub replays a key's stored answer for that long); a provider known
// to keep messages visible longer may be given more, one that keeps them
// less must be given less.
const DefaultLookupRetention = 24 * time.Hour

// Settings are the provider settings of the commands that call it (the
// sender, and relay resolve), bound to flags and environment variables by
// BindSettings.
type Settings struct {
	Kind           string // generic or twilio
	BaseURL        string
	AllowInsecure  bool
	APIKey         string
	TwilioSID      string
	TwilioToken    string
	TwilioFrom     string
	TwilioService  string
	Timeout        time.Duration
	Idempotent     bool
	PermanentCodes string
	Lookup         bool
	LookupSettle   time.Duration
	// LookupRetention is how long the provider keeps a message it accepted
	// visible to lookups: an empty lookup of an attempt older than that says
	// nothing. Default DefaultLookupRetention.
	LookupRetention time.Duration
	ReceiptsURL     string
	// ReceiptsAllowInsecure accepts an http:// ReceiptsURL
	// (RECEIPTS_ALLOW_INSECURE): receipts carry the number and the status.
	ReceiptsAllowInsecure bool
}

// ReceiptsURLCheck refuses an http:// receipts URL unless allowInsecure,
// naming the settings: the provider would call it in clear with the
// number and the status of each message (Twilio's callbacks carry To and
// From). The receiver applies it to its own RECEIPTS_PUBLIC_URL too.
func ReceiptsURLCheck(url string, allowInsecure bool) error {
	if strings.HasPrefix(strings.ToLower(url), "http://") && !allowInsecure {
		return errors.New("-receipts-public-url / RECEIPTS_PUBLIC_URL must be https://: receipts carry phone numbers " +
			"(set RECEIPTS_ALLOW_INSECURE=true for a local receiver)")
	}
	return nil
}

// BindSettings binds the provider settings to s.
func BindSettings(s *envflag.Set, c *Settings) {
	s.Enum(&c.Kind, "sms-provider", "SMS_PROVIDER", "generic", []string{"generic", "twilio"}, "provider API shape: generic (JSON with Idempotency-Key, see docs/design.md) or twilio (never idempotent)")
	s.String(&c.BaseURL, "sms-api-base", "SMS_API_BASE", "", "provider base URL; generic: messages are POSTed to BASE/v1/messages (required); twilio: default https://api.twilio.com")
	s.URL(&c.BaseURL, "sms-api-base", "http", "https")
	s.Bool(&c.AllowInsecure, "sms-api-allow-insecure", "SMS_API_ALLOW_INSECURE", false, "allow an http:// SMS_API_BASE (development and tests only: the key and the messages would cross the network in clear)")
	s.Secret(&c.APIKey, "sms-api-key", "SMS_API_KEY", "generic provider API key, sent as a Bearer token")
	s.String(&c.TwilioSID, "twilio-account-sid", "TWILIO_ACCOUNT_SID", "", "twilio: account SID (basic-auth user)")
	s.Secret(&c.TwilioToken, "twilio-auth-token", "TWILIO_AUTH_TOKEN", "twilio: auth token (basic-auth password)")
	s.String(&c.TwilioFrom, "twilio-from", "TWILIO_FROM", "", "twilio: sending number or sender id")
	s.String(&c.TwilioService, "twilio-messaging-service-sid", "TWILIO_MESSAGING_SERVICE_SID", "", "twilio: messaging service SID, instead of TWILIO_FROM")
	s.Duration(&c.Timeout, "sms-api-timeout", "SMS_API_TIMEOUT", 10*time.Second, 10*time.Millisecond, 10*time.Minute, "bound on one provider attempt")
	s.Bool(&c.Idempotent, "sms-api-idempotent", "SMS_API_IDEMPOTENT", true, "the provider honours Idempotency-Key; false: an attempt whose answer was lost is looked up (SMS_API_LOOKUP) or ends unknown, never retried blindly")
	s.String(&c.PermanentCodes, "sms-permanent-codes", "SMS_PERMANENT_CODES", "", "comma-separated provider error codes to treat as permanent, besides 21211,21214,21614,21610,21612")
	s.Bool(&c.Lookup, "sms-api-lookup", "SMS_API_LOOKUP", false, "the provider can be asked which messages it has for a row (generic: GET BASE/v1/messages?reference=; twilio: every page of the number's messages, those created since the row with the same text): an attempt without an answer at a provider without idempotency is settled by a lookup instead of ending unknown")
	s.Duration(&c.LookupSettle, "sms-api-lookup-settle", "SMS_API_LOOKUP_SETTLE", DefaultLookupSettle, 0, time.Hour, "wait after an attempt without an answer before the lookup; assumes a request the provider accepted shows in its lookup within this time")
	s.Duration(&c.LookupRetention, "sms-api-lookup-retention", "SMS_API_LOOKUP_RETENTION", DefaultLookupRetention, time.Minute, 10*366*24*time.Hour, "how long the provider keeps a message it accepted visible to lookups; a lookup that finds nothing for a row whose first attempt is older proves nothing, and the row is left unknown rather than settled dead. Set it no longer than the provider's documented retention")
	s.String(&c.ReceiptsURL, "receipts-public-url", "RECEIPTS_PUBLIC_URL", "", "the receiver's base URL as the provider sees it: requests then ask for delivery receipts there (generic: callback_url BASE/v1/receipts/generic; twilio: StatusCallback BASE/v1/receipts/twilio?ref=ID)")
	s.URL(&c.ReceiptsURL, "receipts-public-url", "http", "https")
	BindReceiptsAllowInsecure(s, &c.ReceiptsAllowInsecure)
	s.Check(c.check)
}

// BindReceiptsAllowInsecure binds RECEIPTS_ALLOW_INSECURE, for the sender's
// and the receiver's RECEIPTS_PUBLIC_URL.
func BindReceiptsAllowInsecure(s *envflag.Set, v *bool) {
	s.Bool(v, "receipts-allow-insecure", "RECEIPTS_ALLOW_INSECURE", false, "allow an http:// RECEIPTS_PUBLIC_URL (development and tests only: the provider would send each receipt, with its number, in clear)")
}

func (c *Settings) check() error {
	switch {
	case c.Kind == "generic" && c.BaseURL == "":
		return errors.New("-sms-api-base / SMS_API_BASE is required")
	case c.Kind == "twilio" && c.TwilioSID == "":
		return errors.New("-twilio-account-sid / TWILIO_ACCOUNT_SID is required with SMS_PROVIDER=twilio")
	case c.Kind == "twilio" && c.TwilioToken == "":
		return errors.New("TWILIO_AUTH_TOKEN is required with SMS_PROVIDER=twilio")
	case c.Kind == "twilio" && c.TwilioFrom == "" && c.TwilioService == "":
		return errors.New("-twilio-from / TWILIO_FROM (or TWILIO_MESSAGING_SERVICE_SID) is required with SMS_PROVIDER=twilio")
	case strings.HasPrefix(strings.ToLower(c.BaseURL), "http://") && !c.AllowInsecure:
		return errors.New("-sms-api-base / SMS_API_BASE must be https:// (set SMS_API_ALLOW_INSECURE=true for a local stub)")
	case c.LookupRetention <= c.LookupSettle:
		return fmt.Errorf("-sms-api-lookup-retention / SMS_API_LOOKUP_RETENTION (%s) must be longer than SMS_API_LOOKUP_SETTLE (%s): a lookup after the settle time must still see the message", c.LookupRetention, c.LookupSettle)
	}
	if _, err := parseCodes(c.PermanentCodes); err != nil {
		return fmt.Errorf("-sms-permanent-codes / SMS_PERMANENT_CODES: %w", err)
	}
	return ReceiptsURLCheck(c.ReceiptsURL, c.ReceiptsAllowInsecure)
}

// LooksUp reports whether an attempt without an answer is settled by a
// lookup: lookups are on and the provider would send a retry again.
func (c Settings) LooksUp() bool {
	return c.Lookup && (c.Kind == "twilio" || !c.Idempotent)
}

// Client returns the client the settings describe, with at most maxConns
// connections.
func (c Settings) Client(maxConns int) (*Client, error) {
	codes, err := parseCodes(c.PermanentCodes)
	if err != nil {
		return nil, fmt.Errorf("SMS_PERMANENT_CODES: %w", err)
	}
	var cl *Client
	if c.Kind == "twilio" {
		cl, err = NewTwilio(TwilioConfig{
			BaseURL: c.BaseURL, AccountSID: c.TwilioSID, AuthToken: c.TwilioToken, From: c.TwilioFrom,
			MessagingServiceSID: c.TwilioService, Timeout: c.Timeout, PermanentCodes: codes, MaxConns: maxConns,
			ReceiptsURL: c.ReceiptsURL, Lookup: c.Lookup,
		})
	} else {
		cl, err = New(Config{
			BaseURL: c.BaseURL, APIKey: c.APIKey, Timeout: c.Timeout, Idempotent: c.Idempotent,
			PermanentCodes: codes, MaxConns: maxConns, ReceiptsURL: c.ReceiptsURL, Lookup: c.Lookup,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("SMS_API_BASE: %w", err)
	}
	return cl, nil
}

func parseCodes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}
