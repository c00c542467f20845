package smsstub

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"
)

// Defaults applied by New and SetFaults to zero-valued fields.
const (
	// DefaultRetention is how long a stored response is replayed when
	// Config.Retention is zero.
	DefaultRetention = 24 * time.Hour
	// DefaultFailStatus is the HTTP status of an injected failure when
	// Faults.FailStatus is zero.
	DefaultFailStatus = 503
	// DefaultRetryAfter is the Retry-After of an injected 429 when
	// Faults.RetryAfter is zero.
	DefaultRetryAfter = time.Second
)

// Withhold modes for Faults.WithholdMode.
const (
	// WithholdHang blocks the response until the client gives up or the
	// Server is closed, like a provider that accepted the message and then
	// stalled.
	WithholdHang = "hang"
	// WithholdClose hijacks the connection and closes it without writing a
	// response, like a provider or proxy that dropped the connection after
	// accepting the message.
	WithholdClose = "close"
)

// Config configures a Server. The zero value is a valid, idempotent,
// fault-free stub with no authentication.
//
// Config embeds Faults, so cfg.FailRate and friends work directly; because
// Faults has its own JSON methods, Config is not meant to be marshalled.
type Config struct {
	// APIKey, when non-empty, is the bearer token every /v1/messages request
	// must carry as "Authorization: Bearer <APIKey>"; other requests get 401
	// code 20003. Empty (the default) disables authentication.
	APIKey string

	// Retention is how long a key's stored response is replayed after it was
	// stored; later requests with the key are treated as unseen. Zero means
	// DefaultRetention (24h); negative is an error.
	Retention time.Duration

	// IgnoreKeys makes the stub non-idempotent, like a provider without
	// idempotency support: Idempotency-Key is optional, nothing is stored or
	// replayed, and every request that gets past the faults is a new
	// delivery, so the per-key delivery count also counts resends. Requests
	// without a key are then recorded under the empty key. Default false.
	IgnoreKeys bool

	// Faults is the initial fault injection; see SetFaults to change it at
	// run time.
	Faults
	// Receipts configures the delivery receipts sent to each request's
	// callback_url, and the fate lookups show; the zero value sends none.
	Receipts Receipts
	// Twilio enables and configures the Twilio-compatible facade
	// (twilio.go); the zero value serves none.
	Twilio Twilio

	// Rand, when non-nil, is the random source for fault decisions and
	// latency jitter; it is only used with the Server's lock held, so it need
	// not be safe for concurrent use. It takes precedence over Seed.
	Rand rand.Source

	// Seed seeds the random source when Rand is nil, for reproducible fault
	// sequences. Zero (the default) seeds from the system's randomness.
	Seed int64

	// Logger receives start-up, fault change and, at debug level, per-request
	// outcome records. Records carry provider ids, statuses and outcomes only:
	// never phone numbers, message bodies, idempotency keys or the API key.
	// Nil discards logs.
	Logger *slog.Logger

	// Now is the clock used for retention and for messages' expires_at,
	// so tests can expire entries and messages without sleeping. Nil
	// means time.Now.
	Now func() time.Time
}

// Faults is the misbehaviour injected into /v1/messages requests whose key
// is unseen, and into every request to the Twilio facade (which has no
// keys); replays and idempotency errors are never faulted. Rates are
// probabilities in [0, 1], drawn independently per request. The zero value
// injects nothing.
//
// Faults marshals to JSON with snake_case names and durations as Go duration
// strings, for example
//
//	{"fail_rate":0.5,"fail_status":503,"fail_code":30008,"rate_limit_rate":0,
//	 "retry_after":"1s","latency":"20ms","latency_jitter":"5ms",
//	 "withhold_rate":0,"withhold_mode":"hang"}
//
// When unmarshalling, durations may also be JSON numbers of nanoseconds,
// omitted fields are zero (and so take their defaults), and unknown fields
// are an error so that a typo in a chaos test does not silently do nothing.
type Faults struct {
	// FailRate is the probability that a request fails with FailStatus
	// instead of being delivered. Default 0.
	FailRate float64

	// FailStatus is the HTTP status of an injected failure, 400 to 599.
	// Zero means DefaultFailStatus (503).
	FailStatus int

	// FailCode is the provider error code in an injected failure's JSON
	// body; zero (the default) omits the code.
	FailCode int

	// RateLimitRate is the probability that a request is answered 429 with
	// a Retry-After header. It is drawn before FailRate. Default 0.
	RateLimitRate float64

	// RetryAfter is the back-off advertised by an injected 429, sent as
	// whole delta-seconds rounded up (so at least 1). Zero means
	// DefaultRetryAfter (1s).
	RetryAfter time.Duration

	// RateLimit is the requests per second the stub takes, like a provider
	// account's throughput tier; a request above it (a token bucket of
	// RateBurst) is answered 429 without Retry-After, as Twilio does.
	// Replays are not counted. Zero (the default) means no limit.
	RateLimit float64

	// RateBurst is the token bucket's size for RateLimit; zero means
	// max(1, RateLimit/10).
	RateBurst float64

	// Latency is a fixed delay added before a request with an unseen key is
	// processed; the key is in flight meanwhile, so concurrent requests with
	// it get 409. If the client gives up during the delay the message is not
	// delivered. Default 0.
	Latency time.Duration

	// LatencyJitter is the upper bound of a uniformly distributed extra
	// delay added to Latency. Default 0.
	LatencyJitter time.Duration

	// WithholdRate is the probability that a successful request is accepted
	// (delivery counted, response stored) and its response then withheld
	// as WithholdMode says. Default 0.
	WithholdRate float64

	// WithholdMode is WithholdHang or WithholdClose; empty means
	// WithholdHang.
	WithholdMode string
	// DropRate is the probability that a request is lost before the stub
	// takes it: the connection is closed without an answer and nothing is
	// delivered. Default 0.
	DropRate float64
	// LookupFailRate is the probability that a lookup (GET /v1/messages, or
	// the Twilio facade's list) fails with 500. Default 0.
	LookupFailRate float64
	// ReceiptLossRate is the probability that a message accepted with a
	// callback never gets its receipts: its fate is decided, and lookups
	// show it, but no receipt is sent, as when a provider's callbacks are
	// lost. Default 0.
	ReceiptLossRate float64
	// GenericOnly keeps the Twilio facade out of the faults: they act on
	// the generic API's requests alone, as on the first of two providers
	// while the second answers normally. Default false (both).
	GenericOnly bool
}

// normalized returns f with defaults applied, or an error naming the first
// invalid field.
func (f Faults) normalized() (Faults, error) {
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"FailRate", f.FailRate},
		{"RateLimitRate", f.RateLimitRate},
		{"WithholdRate", f.WithholdRate},
		{"DropRate", f.DropRate},
		{"LookupFailRate", f.LookupFailRate},
		{"ReceiptLossRate", f.ReceiptLossRate},
	} {
		// Written as a negated range check so that NaN is rejected too.
		if !(r.v >= 0 && r.v <= 1) {
			return Faults{}, fmt.Errorf("invalid %s %v: must be within [0, 1]", r.name, r.v)
		}
	}
	if f.FailStatus == 0 {
		f.FailStatus = DefaultFailStatus
	}
	if f.FailStatus < 400 || f.FailStatus > 599 {
		return Faults{}, fmt.Errorf("invalid FailStatus %d: must be within [400, 599]", f.FailStatus)
	}
	if f.FailCode < 0 {
		return Faults{}, fmt.Errorf("invalid FailCode %d: must not be negative", f.FailCode)
	}
	if f.RetryAfter == 0 {
		f.RetryAfter = DefaultRetryAfter
	}
	if !(f.RateLimit >= 0) || !(f.RateBurst >= 0) {
		return Faults{}, fmt.Errorf("invalid RateLimit %v or RateBurst %v: must not be negative", f.RateLimit, f.RateBurst)
	}
	if f.RateLimit > 0 && f.RateBurst == 0 {
		f.RateBurst = max(1, f.RateLimit/10)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"RetryAfter", f.RetryAfter},
		{"Latency", f.Latency},
		{"LatencyJitter", f.LatencyJitter},
	} {
		if d.v < 0 {
			return Faults{}, fmt.Errorf("invalid %s %v: must not be negative", d.name, d.v)
		}
	}
	switch f.WithholdMode {
	case "":
		f.WithholdMode = WithholdHang
	case WithholdHang, WithholdClose:
	default:
		return Faults{}, fmt.Errorf("invalid WithholdMode %q: must be %q or %q", f.WithholdMode, WithholdHang, WithholdClose)
	}
	return f, nil
}

// faultsJSON is the wire form of Faults.
type faultsJSON struct {
	FailRate      float64      `json:"fail_rate"`
	FailStatus    int          `json:"fail_status"`
	FailCode      int          `json:"fail_code"`
	RateLimitRate float64      `json:"rate_limit_rate"`
	RetryAfter    jsonDuration `json:"retry_after"`
	RateLimit     float64      `json:"rate_limit"`
	RateBurst     float64      `json:"rate_burst"`
	Latency       jsonDuration `json:"latency"`
	LatencyJitter jsonDuration `json:"latency_jitter"`
	WithholdRate  float64      `json:"withhold_rate"`
	WithholdMode  string       `json:"withhold_mode"`
	DropRate      float64      `json:"drop_rate"`
	LookupFail    float64      `json:"lookup_fail_rate"`
	ReceiptLoss   float64      `json:"receipt_loss_rate"`
	GenericOnly   bool         `json:"generic_only,omitempty"`
}

// MarshalJSON encodes f with snake_case names and duration strings.
func (f Faults) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultsJSON{
		FailRate:      f.FailRate,
		FailStatus:    f.FailStatus,
		FailCode:      f.FailCode,
		RateLimitRate: f.RateLimitRate,
		RetryAfter:    jsonDuration(f.RetryAfter),
		RateLimit:     f.RateLimit,
		RateBurst:     f.RateBurst,
		Latency:       jsonDuration(f.Latency),
		LatencyJitter: jsonDuration(f.LatencyJitter),
		WithholdRate:  f.WithholdRate,
		WithholdMode:  f.WithholdMode,
		DropRate:      f.DropRate,
		LookupFail:    f.LookupFailRate,
		ReceiptLoss:   f.ReceiptLossRate,
		GenericOnly:   f.GenericOnly,
	})
}

// UnmarshalJSON decodes the form MarshalJSON produces, rejecting unknown
// fields. It does not validate or apply defaults; New and SetFaults do.
func (f *Faults) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var w faultsJSON
	if err := dec.Decode(&w); err != nil {
		return fmt.Errorf("decode faults: %w", err)
	}
	*f = Faults{
		FailRate:        w.FailRate,
		FailStatus:      w.FailStatus,
		FailCode:        w.FailCode,
		RateLimitRate:   w.RateLimitRate,
		RetryAfter:      time.Duration(w.RetryAfter),
		RateLimit:       w.RateLimit,
		RateBurst:       w.RateBurst,
		Latency:         time.Duration(w.Latency),
		LatencyJitter:   time.Duration(w.LatencyJitter),
		WithholdRate:    w.WithholdRate,
		WithholdMode:    w.WithholdMode,
		DropRate:        w.DropRate,
		LookupFailRate:  w.LookupFail,
		ReceiptLossRate: w.ReceiptLoss,
		GenericOnly:     w.GenericOnly,
	}
	return nil
}

// jsonDuration is a time.Duration that is written as a Go duration string
// and read from either such a string or a number of nanoseconds (the form
// encoding/json gives a plain time.Duration).
type jsonDuration time.Duration

func (d jsonDuration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *jsonDuration) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		// encoding/json convention: null leaves the value alone.
		return nil
	}
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = jsonDuration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		return errors.New("duration must be a string such as \"250ms\" or an integer number of nanoseconds")
	}
	*d = jsonDuration(n)
	return nil
}

// Announcement starts the one line the smsstub command prints on stdout once
// it listens; the stub's base URL follows it.
const Announcement = "smsstub listening on "
