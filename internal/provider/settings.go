package provider

import (
	"errors"
	"fmt"
	"slices"
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
	Kind string // generic, twilio, vonage, sinch or telnyx
	// Providers is SMS_PROVIDERS: an ordered failover list of kinds, or
	// empty for Kind alone.
	Providers      string
	VonageBaseURL  string
	BaseURL        string
	TwilioBaseURL  string
	AllowInsecure  bool
	APIKey         string
	TwilioSID      string
	TwilioToken    string
	TwilioFrom     string
	TwilioService  string
	VonageKey      string
	VonageSecret   string
	VonageFrom     string
	SinchBaseURL   string
	SinchPlanID    string
	SinchToken     string
	SinchFrom      string
	TelnyxBaseURL  string
	TelnyxKey      string
	TelnyxFrom     string
	TelnyxProfile  string
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
	s.Group("provider: which, and how its answers are settled")
	s.Enum(&c.Kind, "sms-provider", "SMS_PROVIDER", "generic", Kinds, "provider API shape: generic (JSON with Idempotency-Key, see docs/design.md), twilio, vonage (the Messages API), sinch (the SMS REST API) or telnyx (Messaging, API v2); all but generic are never idempotent (docs/providers.md)")
	s.String(&c.Providers, "sms-providers", "SMS_PROVIDERS", "", "an ordered list of providers to fail over between, instead of SMS_PROVIDER (e.g. twilio,vonage): a message goes to the first whose circuit is closed and moves to the next only when its provider certainly did not take it (the request never left, a 503, or the circuit open), never after an answer was lost (docs/providers.md)")
	s.Duration(&c.Timeout, "sms-api-timeout", "SMS_API_TIMEOUT", 10*time.Second, 10*time.Millisecond, 10*time.Minute, "bound on one provider attempt")
	s.String(&c.PermanentCodes, "sms-permanent-codes", "SMS_PERMANENT_CODES", "", "comma-separated provider error codes to treat as permanent, besides 21211,21214,21614,21610,21612; believed only on an answer that took nothing (a 4xx, a 429): on a 408, 409, 425 or 5xx, which may follow a message the provider took, the status decides")
	s.Bool(&c.Lookup, "sms-api-lookup", "SMS_API_LOOKUP", false, "the provider can be asked which messages it has for a row (generic: GET BASE/v1/messages?reference=; twilio: every page of the number's messages, those created since the row with the same text; vonage and telnyx: none, refused; sinch: every page of SINCH_FROM's batches since the row, by client_reference): an attempt without an answer at a provider without idempotency is settled by a lookup instead of ending unknown")
	s.Duration(&c.LookupSettle, "sms-api-lookup-settle", "SMS_API_LOOKUP_SETTLE", DefaultLookupSettle, 0, time.Hour, "wait after an attempt without an answer before the lookup; assumes a request the provider accepted shows in its lookup within this time")
	s.Duration(&c.LookupRetention, "sms-api-lookup-retention", "SMS_API_LOOKUP_RETENTION", DefaultLookupRetention, time.Minute, 10*366*24*time.Hour, "how long the provider keeps a message it accepted visible to lookups; a lookup that finds nothing for a row whose first attempt is older proves nothing, and the row is left unknown rather than settled dead. Set it no longer than the provider's documented retention")
	s.Bool(&c.AllowInsecure, "sms-api-allow-insecure", "SMS_API_ALLOW_INSECURE", false, "allow an http:// SMS_API_BASE (development and tests only: the key and the messages would cross the network in clear)")
	s.Group("provider: generic")
	s.String(&c.BaseURL, "sms-api-base", "SMS_API_BASE", "", "provider base URL; generic: messages are POSTed to BASE/v1/messages (required); twilio: default https://api.twilio.com; vonage: default https://api.nexmo.com; sinch: default https://us.sms.api.sinch.com; telnyx: default https://api.telnyx.com (with SMS_PROVIDERS, TWILIO_API_BASE, VONAGE_API_BASE, SINCH_API_BASE and TELNYX_API_BASE instead)")
	s.URL(&c.BaseURL, "sms-api-base", "http", "https")
	s.Secret(&c.APIKey, "sms-api-key", "SMS_API_KEY", "generic provider API key, sent as a Bearer token")
	s.Bool(&c.Idempotent, "sms-api-idempotent", "SMS_API_IDEMPOTENT", true, "the provider honours Idempotency-Key; false: an attempt whose answer was lost is looked up (SMS_API_LOOKUP) or ends unknown, never retried blindly")
	s.Group("provider: twilio")
	s.String(&c.TwilioBaseURL, "twilio-api-base", "TWILIO_API_BASE", "", "twilio: API base URL, default https://api.twilio.com (or SMS_API_BASE when twilio is the only provider)")
	s.URL(&c.TwilioBaseURL, "twilio-api-base", "http", "https")
	s.String(&c.TwilioSID, "twilio-account-sid", "TWILIO_ACCOUNT_SID", "", "twilio: account SID (basic-auth user)")
	s.Secret(&c.TwilioToken, "twilio-auth-token", "TWILIO_AUTH_TOKEN", "twilio: auth token (basic-auth password)")
	s.String(&c.TwilioFrom, "twilio-from", "TWILIO_FROM", "", "twilio: sending number or sender id")
	s.String(&c.TwilioService, "twilio-messaging-service-sid", "TWILIO_MESSAGING_SERVICE_SID", "", "twilio: messaging service SID, instead of TWILIO_FROM")
	s.Group("provider: vonage")
	s.String(&c.VonageBaseURL, "vonage-api-base", "VONAGE_API_BASE", "", "vonage: API base URL, default https://api.nexmo.com (or SMS_API_BASE when vonage is the only provider)")
	s.URL(&c.VonageBaseURL, "vonage-api-base", "http", "https")
	s.String(&c.VonageKey, "vonage-api-key", "VONAGE_API_KEY", "", "vonage: API key (basic-auth user)")
	s.Secret(&c.VonageSecret, "vonage-api-secret", "VONAGE_API_SECRET", "vonage: API secret (basic-auth password)")
	s.String(&c.VonageFrom, "vonage-from", "VONAGE_FROM", "", "vonage: sending number (E.164, the '+' optional) or alphanumeric sender id")
	s.Group("provider: sinch")
	s.String(&c.SinchBaseURL, "sinch-api-base", "SINCH_API_BASE", "", "sinch: the API's regional base URL, default https://us.sms.api.sinch.com (e.g. https://eu.sms.api.sinch.com; or SMS_API_BASE when sinch is the only provider)")
	s.URL(&c.SinchBaseURL, "sinch-api-base", "http", "https")
	s.String(&c.SinchPlanID, "sinch-service-plan-id", "SINCH_SERVICE_PLAN_ID", "", "sinch: service plan id (in the API's path)")
	s.Secret(&c.SinchToken, "sinch-api-token", "SINCH_API_TOKEN", "sinch: the service plan's API token (sent as a Bearer token)")
	s.String(&c.SinchFrom, "sinch-from", "SINCH_FROM", "", "sinch: sender (E.164 number, short code or alphanumeric sender id); the lookup lists the batches from it")
	s.Group("provider: telnyx")
	s.String(&c.TelnyxBaseURL, "telnyx-api-base", "TELNYX_API_BASE", "", "telnyx: API base URL, default https://api.telnyx.com (or SMS_API_BASE when telnyx is the only provider)")
	s.URL(&c.TelnyxBaseURL, "telnyx-api-base", "http", "https")
	s.Secret(&c.TelnyxKey, "telnyx-api-key", "TELNYX_API_KEY", "telnyx: API v2 key, sent as a Bearer token")
	s.String(&c.TelnyxFrom, "telnyx-from", "TELNYX_FROM", "", "telnyx: sending number (+E.164), alphanumeric sender id or short code; TELNYX_MESSAGING_PROFILE_ID instead or as well")
	s.String(&c.TelnyxProfile, "telnyx-messaging-profile-id", "TELNYX_MESSAGING_PROFILE_ID", "", "telnyx: messaging profile to send with (a number pool; Telnyx requires one with an alphanumeric sender id)")
	s.Group("receipts")
	s.String(&c.ReceiptsURL, "receipts-public-url", "RECEIPTS_PUBLIC_URL", "", "the receiver's base URL as the provider sees it: requests then ask for delivery receipts there (generic: callback_url BASE/v1/receipts/generic; twilio: StatusCallback BASE/v1/receipts/twilio?ref=ID; vonage: webhook_url BASE/v1/receipts/vonage; sinch: callback_url BASE/v1/receipts/sinch, a report per recipient; telnyx: webhook_url BASE/v1/receipts/telnyx?ref=ID)")
	s.URL(&c.ReceiptsURL, "receipts-public-url", "http", "https")
	BindReceiptsAllowInsecure(s, &c.ReceiptsAllowInsecure)
	s.Check(c.check)
}

// Kinds are the provider kinds SMS_PROVIDER and SMS_PROVIDERS name.
var Kinds = []string{"generic", "twilio", "vonage", "sinch", "telnyx"}

// Names returns the providers in order: SMS_PROVIDERS, or SMS_PROVIDER
// alone.
func (c *Settings) Names() ([]string, error) {
	if strings.TrimSpace(c.Providers) == "" {
		return []string{c.Kind}, nil
	}
	var names []string
	for _, f := range strings.Split(c.Providers, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
			continue
		case !slices.Contains(Kinds, f):
			return nil, fmt.Errorf("-sms-providers / SMS_PROVIDERS: unknown provider %q (known: %s)", f, strings.Join(Kinds, ", "))
		case slices.Contains(names, f):
			return nil, fmt.Errorf("-sms-providers / SMS_PROVIDERS: %q is named twice", f)
		}
		names = append(names, f)
	}
	if len(names) == 0 {
		return nil, errors.New("-sms-providers / SMS_PROVIDERS names no provider")
	}
	return names, nil
}

// Failover reports whether SMS_PROVIDERS names the providers.
func (c *Settings) Failover() bool { return strings.TrimSpace(c.Providers) != "" }

// BindReceiptsAllowInsecure binds RECEIPTS_ALLOW_INSECURE, for the sender's
// and the receiver's RECEIPTS_PUBLIC_URL.
func BindReceiptsAllowInsecure(s *envflag.Set, v *bool) {
	s.Bool(v, "receipts-allow-insecure", "RECEIPTS_ALLOW_INSECURE", false, "allow an http:// RECEIPTS_PUBLIC_URL (development and tests only: the provider would send each receipt, with its number, in clear)")
}

func (c *Settings) check() error {
	names, err := c.Names()
	if err != nil {
		return err
	}
	with := func(kind string) string {
		if c.Failover() {
			return kind + " in SMS_PROVIDERS"
		}
		return "SMS_PROVIDER=" + kind
	}
	has := func(k string) bool { return slices.Contains(names, k) }
	// Every rule is checked: a start-up names all that is wrong at once.
	rules := []rule{
		{has("generic") && c.BaseURL == "", errors.New("-sms-api-base / SMS_API_BASE is required")},
		{has("twilio") && c.TwilioSID == "", fmt.Errorf("-twilio-account-sid / TWILIO_ACCOUNT_SID is required with %s", with("twilio"))},
		{has("twilio") && c.TwilioToken == "", fmt.Errorf("TWILIO_AUTH_TOKEN is required with %s", with("twilio"))},
		{has("twilio") && c.TwilioFrom == "" && c.TwilioService == "", fmt.Errorf("-twilio-from / TWILIO_FROM (or TWILIO_MESSAGING_SERVICE_SID) is required with %s", with("twilio"))},
		{has("vonage") && c.VonageKey == "", fmt.Errorf("-vonage-api-key / VONAGE_API_KEY is required with %s", with("vonage"))},
		{has("vonage") && c.VonageSecret == "", fmt.Errorf("VONAGE_API_SECRET is required with %s", with("vonage"))},
		{has("vonage") && c.VonageFrom == "", fmt.Errorf("-vonage-from / VONAGE_FROM is required with %s", with("vonage"))},
		{has("vonage") && c.Lookup, fmt.Errorf("-sms-api-lookup / SMS_API_LOOKUP=true cannot be used with %s: Vonage offers no lookup by our reference, so an attempt whose answer was lost ends unknown unless a receipt arrives (docs/providers.md)", with("vonage"))},
		{has("sinch") && c.SinchPlanID == "", fmt.Errorf("-sinch-service-plan-id / SINCH_SERVICE_PLAN_ID is required with %s", with("sinch"))},
		{has("sinch") && c.SinchToken == "", fmt.Errorf("SINCH_API_TOKEN is required with %s", with("sinch"))},
		{has("sinch") && c.SinchFrom == "", fmt.Errorf("-sinch-from / SINCH_FROM is required with %s", with("sinch"))},
		{has("sinch") && c.Lookup && c.LookupRetention > SinchListRetention, fmt.Errorf("-sms-api-lookup-retention / SMS_API_LOOKUP_RETENTION (%s) cannot exceed 14 days with %s and SMS_API_LOOKUP=true: Sinch lists the batches of the last 14 days only", c.LookupRetention, with("sinch"))},
		c.httpsBase(c.SinchBaseURL, "sinch-api-base", "SINCH_API_BASE"),
		{has("telnyx") && c.TelnyxKey == "", fmt.Errorf("TELNYX_API_KEY is required with %s", with("telnyx"))},
		{has("telnyx") && c.TelnyxFrom == "" && c.TelnyxProfile == "", fmt.Errorf("-telnyx-from / TELNYX_FROM (or TELNYX_MESSAGING_PROFILE_ID) is required with %s", with("telnyx"))},
		{has("telnyx") && c.Lookup, fmt.Errorf("-sms-api-lookup / SMS_API_LOOKUP=true cannot be used with %s: Telnyx offers no lookup by our reference, so an attempt whose answer was lost ends unknown unless a receipt arrives (docs/providers.md)", with("telnyx"))},
		c.httpsBase(c.TelnyxBaseURL, "telnyx-api-base", "TELNYX_API_BASE"),
		c.httpsBase(c.VonageBaseURL, "vonage-api-base", "VONAGE_API_BASE"),
		c.httpsBase(c.BaseURL, "sms-api-base", "SMS_API_BASE"),
		c.httpsBase(c.TwilioBaseURL, "twilio-api-base", "TWILIO_API_BASE"),
		{c.LookupRetention <= c.LookupSettle, fmt.Errorf("-sms-api-lookup-retention / SMS_API_LOOKUP_RETENTION (%s) must be longer than SMS_API_LOOKUP_SETTLE (%s): a lookup after the settle time must still see the message", c.LookupRetention, c.LookupSettle)},
	}
	var errs []error
	for _, r := range rules {
		if r.bad {
			errs = append(errs, r.err)
		}
	}
	if _, err := parseCodes(c.PermanentCodes); err != nil {
		errs = append(errs, fmt.Errorf("-sms-permanent-codes / SMS_PERMANENT_CODES: %w", err))
	}
	errs = append(errs, ReceiptsURLCheck(c.ReceiptsURL, c.ReceiptsAllowInsecure))
	return errors.Join(errs...)
}

// httpsBase is the rule that a provider's base URL, the setting flag / env,
// is https:// unless SMS_API_ALLOW_INSECURE: the credentials and the
// messages would otherwise cross the network in clear.
func (c *Settings) httpsBase(base, flag, env string) rule {
	return rule{strings.HasPrefix(strings.ToLower(base), "http://") && !c.AllowInsecure,
		fmt.Errorf("-%s / %s must be https:// (set SMS_API_ALLOW_INSECURE=true for a local stub)", flag, env)}
}

// LooksUp reports whether an attempt without an answer is settled by a
// lookup: lookups are on and the provider would send a retry again.
func (c Settings) LooksUp() bool {
	names, _ := c.Names()
	return c.Lookup && (slices.Contains(names, "twilio") || slices.Contains(names, "sinch") || (slices.Contains(names, "generic") && !c.Idempotent))
}

// Named is one provider of the settings, with its name.
type Named struct {
	Name   string
	Client *Client
}

// Clients returns a client per provider, in order (SMS_PROVIDERS, or
// SMS_PROVIDER alone), each with at most maxConns connections.
func (c Settings) Clients(maxConns int) ([]Named, error) {
	names, err := c.Names()
	if err != nil {
		return nil, err
	}
	out := make([]Named, 0, len(names))
	for _, n := range names {
		cl, err := c.client(n, maxConns)
		if err != nil {
			return nil, err
		}
		out = append(out, Named{Name: n, Client: cl})
	}
	return out, nil
}

// LookupClients is Clients with lookups on at every provider that offers
// them (relay resolve): a provider that offers none (Vonage, Telnyx) is built
// without, and cannot settle its rows.
func (c Settings) LookupClients(maxConns int) ([]Named, error) {
	names, err := c.Names()
	if err != nil {
		return nil, err
	}
	out := make([]Named, 0, len(names))
	for _, n := range names {
		cc := c
		cc.Lookup = n != "vonage" && n != "telnyx"
		cl, err := cc.client(n, maxConns)
		if err != nil {
			return nil, err
		}
		out = append(out, Named{Name: n, Client: cl})
	}
	return out, nil
}

// Client returns the client the settings describe (SMS_PROVIDER), with at
// most maxConns connections.
func (c Settings) Client(maxConns int) (*Client, error) {
	return c.client(c.Kind, maxConns)
}

// baseFor returns an adapter's base URL: its own setting, or SMS_API_BASE
// when it is the only provider (SMS_PROVIDERS unset).
func (c Settings) baseFor(own string) string {
	if own == "" && !c.Failover() {
		return c.BaseURL
	}
	return own
}

func (c Settings) client(kind string, maxConns int) (*Client, error) {
	codes, err := parseCodes(c.PermanentCodes)
	if err != nil {
		return nil, fmt.Errorf("SMS_PERMANENT_CODES: %w", err)
	}
	var cl *Client
	switch kind {
	case "vonage":
		base := c.baseFor(c.VonageBaseURL)
		cl, err = NewVonage(VonageConfig{
			BaseURL: base, APIKey: c.VonageKey, APISecret: c.VonageSecret, From: c.VonageFrom,
			Timeout: c.Timeout, PermanentCodes: codes, MaxConns: maxConns, ReceiptsURL: c.ReceiptsURL, Lookup: c.Lookup,
		})
	case "sinch":
		base := c.baseFor(c.SinchBaseURL)
		cl, err = NewSinch(SinchConfig{
			BaseURL: base, ServicePlanID: c.SinchPlanID, APIToken: c.SinchToken, From: c.SinchFrom,
			Timeout: c.Timeout, PermanentCodes: codes, MaxConns: maxConns, ReceiptsURL: c.ReceiptsURL, Lookup: c.Lookup,
		})
	case "telnyx":
		base := c.baseFor(c.TelnyxBaseURL)
		cl, err = NewTelnyx(TelnyxConfig{
			BaseURL: base, APIKey: c.TelnyxKey, From: c.TelnyxFrom, MessagingProfileID: c.TelnyxProfile,
			Timeout: c.Timeout, PermanentCodes: codes, MaxConns: maxConns, ReceiptsURL: c.ReceiptsURL, Lookup: c.Lookup,
		})
	case "twilio":
		base := c.baseFor(c.TwilioBaseURL)
		cl, err = NewTwilio(TwilioConfig{
			BaseURL: base, AccountSID: c.TwilioSID, AuthToken: c.TwilioToken, From: c.TwilioFrom,
			MessagingServiceSID: c.TwilioService, Timeout: c.Timeout, PermanentCodes: codes, MaxConns: maxConns,
			ReceiptsURL: c.ReceiptsURL, Lookup: c.Lookup,
		})
	default:
		cl, err = New(Config{
			BaseURL: c.BaseURL, APIKey: c.APIKey, Timeout: c.Timeout, Idempotent: c.Idempotent,
			PermanentCodes: codes, MaxConns: maxConns, ReceiptsURL: c.ReceiptsURL, Lookup: c.Lookup,
		})
	}
	if errors.Is(err, ErrNoLookup) {
		return nil, fmt.Errorf("SMS_PROVIDER=%s: %w", kind, err)
	}
	if err != nil {
		// An adapter's own base URL setting, or SMS_API_BASE in its stead,
		// is what its errors name; the generic API has SMS_API_BASE alone.
		if kind != "generic" && slices.Contains(Kinds, kind) {
			return nil, fmt.Errorf("%s_API_BASE / SMS_API_BASE: %w", strings.ToUpper(kind), err)
		}
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
