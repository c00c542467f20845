package provider

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/sendonce/sendonce/internal/safetext"
)

// DefaultPermanentCodes are provider error codes that no retry can fix
// (Twilio's numbering, which several providers share): 21211 invalid To,
// 21214 To cannot be reached, 21614 To is not a mobile number, 21610 the
// recipient unsubscribed, 21612 unroutable. They make an answer Permanent
// only where its status says the provider took nothing.
var DefaultPermanentCodes = []int{21211, 21214, 21614, 21610, 21612}

// MaxResponseBytes is the most of a response body read; a larger body is
// classified as malformed, never read into memory whole.
const MaxResponseBytes = 64 << 10

// Message is one send request.
type Message struct {
	// Key is the idempotency key: the outbox row id, the same on every attempt.
	Key string
	// To is the E.164 destination.
	To string
	// Body is the text.
	Body string
	// ExpiresAt, when not zero, is when the message stops being worth
	// sending: no request is built at or after it (Send returns Expired),
	// and each request tells the provider the time left then, in the
	// parameter its API defines for it (docs/providers.md, "Expiry").
	ExpiresAt time.Time
}

// expiredReason is the Reason of an Expired outcome.
const expiredReason = "not sent: the message expired before the request left"

// Config configures a generic provider client (the generic API of docs/design.md).
type Config struct {
	// BaseURL is the provider's base URL; POSTs go to BaseURL/v1/messages.
	// Required.
	BaseURL string
	// APIKey is sent as "Authorization: Bearer APIKey" when non-empty.
	APIKey string
	// Timeout bounds each attempt, from dialing to the last response byte;
	// default 10s.
	Timeout time.Duration
	// ConnectTimeout bounds dialing; default min(Timeout, 5s).
	ConnectTimeout time.Duration
	// Idempotent declares that the provider honours Idempotency-Key. When
	// false, an attempt that may have reached the provider and lost its
	// answer is Ambiguous instead of Retry: the safe zero value.
	Idempotent bool
	// PermanentCodes are provider error codes classified Permanent in
	// addition to DefaultPermanentCodes, on an answer that took nothing:
	// on a 408, 409, 425 or 5xx the status decides.
	PermanentCodes []int
	// MaxConns sizes the keep-alive pool: set it to the sender's
	// concurrency. Default 64.
	MaxConns int
	// MaxRetryAfter caps a provider's Retry-After; default 1h.
	MaxRetryAfter time.Duration
	// ReceiptsURL is the base URL of the receiver as the provider sees it
	// (RECEIPTS_PUBLIC_URL); when set, every request asks for delivery
	// receipts there. Empty asks for none.
	ReceiptsURL string
	// Lookup enables Lookup: the provider can be asked which messages it
	// has for a reference (GET BaseURL/v1/messages?reference=).
	Lookup bool
	// Transport, when set, replaces the default transport (tests).
	Transport http.RoundTripper
}

// Client sends messages through a provider's generic HTTP API.
type Client struct {
	cfg       Config
	endpoint  string
	auth      string
	http      *http.Client
	permanent []int
	// newRequest builds the provider's request shape for m at now, which
	// is before m.ExpiresAt when that is set: the time left for the
	// provider is m.ExpiresAt less now.
	newRequest func(ctx context.Context, m Message, now time.Time) (*http.Request, error)
	// refField names the message id in a success response.
	refField string
	// refOf, when set, reads the message id of a success response instead
	// of refField (an id nested deeper than the top level: Telnyx's
	// data.id); "" when there is none.
	refOf func(data []byte) string
	// lookup asks the provider which messages it has for q.
	lookup func(ctx context.Context, q LookupQuery) ([]Found, error)
	// byContent: lookup finds messages by number and text (Twilio).
	byContent bool
	// errorFields reads an error answer's code (0 when none) and text;
	// nil reads the generic {"code","message"}.
	errorFields func(data []byte) (code int, text string, ok bool)
	// refused are statuses the provider documents as a refusal before
	// anything was processed that a later attempt may get past (Vonage's
	// 402, a low balance): Retry, never Ambiguous.
	refused []int
	// unavailableTakesNothing: the API's contract says a 503 means the
	// request was not processed (the generic API's, docs/design.md), so a
	// message answered 503 may go to another provider.
	unavailableTakesNothing bool
	// expiredCode, when not 0, is the error code with which the API
	// refuses a message whose expiry had passed when it arrived (the
	// generic API's CodeExpired): nothing was taken, and the message is
	// expired rather than dead.
	expiredCode int
	// optOut are the error codes with which the API refuses a message
	// because its recipient opted out (optout.go): Permanent, OptedOut.
	// They are believed on a 4xx that says nothing was taken, and on
	// optOutStatuses, the statuses the provider documents for them
	// (Telnyx's 409).
	optOut, optOutStatuses []int
}

// NotTaken reports whether an attempt certainly left the message untaken
// by the provider, so that another provider may be called: the request
// never had a connection (refused, DNS, TLS), the
// provider answered a status it documents as a refusal before anything
// was processed (refused), or, where the API's contract says so, a 503.
func (c *Client) NotTaken(o Outcome) bool {
	if o.Kind != Retry || o.MaybeAccepted {
		return false
	}
	// Without an answer, only a request that never had a connection is
	// certain: on a live connection, a timeout can race the report that the
	// request was written (which an idempotent client, retrying the same
	// provider under the same key, may ignore; another provider may not).
	return (o.HTTPStatus == 0 && !o.Connected) || slices.Contains(c.refused, o.HTTPStatus) ||
		(o.HTTPStatus == http.StatusServiceUnavailable && c.unavailableTakesNothing)
}

// MaxResponseHeaderBytes bounds the headers of a provider's answer: a
// larger answer fails the attempt (as an answer lost after the request was
// sent).
const MaxResponseHeaderBytes = 64 << 10

// New returns a client, or an error naming the invalid setting.
func New(cfg Config) (*Client, error) {
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Second)
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, min(cfg.Timeout, 5*time.Second))
	cfg.MaxConns = cmp.Or(cfg.MaxConns, 64)
	cfg.MaxRetryAfter = cmp.Or(cfg.MaxRetryAfter, time.Hour)
	u, err := url.Parse(cfg.BaseURL)
	switch {
	case cfg.BaseURL == "":
		return nil, errors.New("provider: BaseURL is required")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, errors.New("provider: BaseURL must be an absolute http or https URL")
	case cfg.Timeout < 0 || cfg.ConnectTimeout < 0:
		return nil, errors.New("provider: timeouts must be positive")
	case cfg.MaxConns < 1:
		return nil, errors.New("provider: MaxConns must be at least 1")
	case cfg.MaxRetryAfter < 0:
		return nil, errors.New("provider: MaxRetryAfter must be positive")
	}
	tr := cfg.Transport
	if tr == nil {
		dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
		tr = &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         dialer.DialContext,
			MaxIdleConns:        cfg.MaxConns,
			MaxIdleConnsPerHost: cfg.MaxConns,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: cfg.ConnectTimeout,
			ForceAttemptHTTP2:   true,
			// A provider's answer has a few hundred bytes of headers;
			// Go's default allows 10 MiB, which a broken or hostile
			// endpoint could make every attempt of every sender read.
			MaxResponseHeaderBytes: MaxResponseHeaderBytes,
			// The attempt's context already ends a stalled answer; this
			// bounds the wait for headers in the transport itself.
			ResponseHeaderTimeout: cfg.Timeout,
		}
	}
	c := &Client{
		cfg:      cfg,
		endpoint: strings.TrimRight(cfg.BaseURL, "/") + "/v1/messages",
		http: &http.Client{
			Transport: tr,
			// A redirect is never followed: it would resend the message
			// somewhere the operator did not configure.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		permanent: append(slices.Clone(DefaultPermanentCodes), cfg.PermanentCodes...),
	}
	if cfg.APIKey != "" {
		c.auth = "Bearer " + cfg.APIKey
	}
	c.newRequest, c.refField = c.genericRequest, "id"
	c.unavailableTakesNothing, c.expiredCode = true, CodeExpired
	c.optOut = optOutCodes["generic"]
	if cfg.Lookup {
		c.lookup = c.genericLookup
	}
	if cfg.ReceiptsURL != "" {
		if u, err := url.Parse(cfg.ReceiptsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, errors.New("provider: ReceiptsURL must be an absolute http or https URL")
		}
	}
	return c, nil
}

// WrapTransport puts wrap around the client's HTTP transport (the process's
// tracing: a span for each request and its traceparent header). Call it
// before the client's first request.
func (c *Client) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	c.http.Transport = wrap(c.http.Transport)
}

// Idempotent reports whether the provider honours idempotency keys.
func (c *Client) Idempotent() bool { return c.cfg.Idempotent }

// Timeout returns the bound on one attempt.
func (c *Client) Timeout() time.Duration { return c.cfg.Timeout }

// Send makes one attempt to send m and classifies its result. It never
// panics on a provider's answer, whatever its shape. A message whose
// expiry has passed when the request would be built is not sent: the
// outcome is Expired, and no request leaves.
func (c *Client) Send(ctx context.Context, m Message) Outcome {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()

	// Set by the transport's writer goroutine once the whole request is on
	// the wire: from then on the provider may have acted on it.
	var wrote, gotConn atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { gotConn.Store(true) },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
	})
	// The time left is measured as the request is built: none left, no
	// request; some left, the provider is told no more than that.
	now := time.Now()
	if expired(m, now) {
		return Outcome{Kind: Expired, Reason: expiredReason, Latency: now.Sub(start)}
	}
	req, err := c.newRequest(ctx, m, now)
	if err != nil {
		return Outcome{Kind: Permanent, Reason: "build request: " + scrub(err.Error()), Latency: time.Since(start)}
	}
	req.Header.Set("User-Agent", "sendonce")
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	if !c.cfg.Idempotent {
		// net/http replays a request carrying an Idempotency-Key by itself
		// when a reused connection drops before the first response byte,
		// though the provider may have acted on it: a second delivery at a
		// provider that ignores the key. Without GetBody it cannot replay.
		req.GetBody = nil
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// WroteRequest fires after the flush: a timeout between the last
		// byte and the callback would look unsent. Any failure on a live
		// connection counts as written: without idempotency a resend could
		// double-send, and with it a row taken for "not sent" may move to
		// another provider of SMS_PROVIDERS while this one has it.
		maybeWritten := wrote.Load() || gotConn.Load()
		o := c.transportFailure(err, maybeWritten)
		o.Latency, o.Connected = time.Since(start), gotConn.Load()
		return o
	}
	defer resp.Body.Close()
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	o := c.classify(resp, data, readErr, m)
	o.Latency, o.Connected = time.Since(start), true
	return o
}

// expired reports whether m has an expiry and now is at or after it: no
// request may start then.
func expired(m Message, now time.Time) bool {
	return !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt)
}

// genericRequest builds the generic API request (docs/design.md): JSON, and the key in
// Idempotency-Key.
func (c *Client) genericRequest(ctx context.Context, m Message, _ time.Time) (*http.Request, error) {
	// The reference (the row id, like the key) lets a receipt and a lookup
	// find the row; the callback asks for the receipts; the expiry is the
	// row's, absolute. All are the same on every attempt, so the body is
	// too, as a provider that compares a key's bodies needs.
	req := struct {
		To          string `json:"to"`
		Body        string `json:"body"`
		Reference   string `json:"reference"`
		CallbackURL string `json:"callback_url,omitempty"`
		ExpiresAt   string `json:"expires_at,omitempty"`
	}{To: m.To, Body: m.Body, Reference: m.Key, ExpiresAt: genericExpiresAt(m.ExpiresAt)}
	if c.cfg.ReceiptsURL != "" {
		req.CallbackURL = receiptsAt(c.cfg.ReceiptsURL, "/v1/receipts/generic")
	}
	hreq, err := c.postJSON(ctx, req)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Idempotency-Key", m.Key)
	return hreq, nil
}

// genericExpiresAt is the generic API's expires_at for the expiry t: RFC
// 3339 in UTC, with as many fractional digits as t has (none for a whole
// second); "" for no expiry, which leaves the field out. The expiry is
// sent as it is, not rounded: the contract has no unit or bound to fit.
func genericExpiresAt(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// genericErrorFields reads the generic API's error answer
// {"code":21211,"message":"..."}.
func genericErrorFields(data []byte) (int, string, bool) {
	var e struct {
		Code    json.Number `json:"code"`
		Message string      `json:"message"`
	}
	if json.Unmarshal(data, &e) != nil {
		return 0, "", false
	}
	return errorCode(e.Code.String()), e.Message, true
}

// transportFailure classifies an attempt that produced no response. Before
// the request was written nothing reached the provider, so a retry is safe
// everywhere; after, only a provider that honours the key makes it safe.
func (c *Client) transportFailure(err error, wrote bool) Outcome {
	what := describe(err)
	if !wrote {
		return Outcome{Kind: Retry, Reason: "request not sent: " + what}
	}
	if c.cfg.Idempotent {
		return Outcome{Kind: Retry, Reason: "no response after the request was sent: " + what, MaybeAccepted: true}
	}
	return Outcome{Kind: Ambiguous, Reason: "no response after the request was sent: " + what, MaybeAccepted: true}
}

func (c *Client) classify(resp *http.Response, data []byte, readErr error, m Message) Outcome {
	status := resp.StatusCode
	if readErr != nil {
		if status >= 200 && status < 300 && !c.cfg.Idempotent {
			// The status line already says the provider accepted. Without
			// idempotency a retry could not recover the id anyway, and
			// "unknown" would misreport a message that was sent.
			return Outcome{Kind: Sent, HTTPStatus: status,
				Reason: fmt.Sprintf("accepted; response body lost: %s", describe(readErr))}
		}
		o := c.transportFailure(readErr, true)
		o.HTTPStatus = status
		o.Reason = fmt.Sprintf("response body lost: %s", describe(readErr))
		return o
	}
	oversize := len(data) > MaxResponseBytes
	if status >= 200 && status < 300 {
		// The provider accepted: that is the fact that matters, even when
		// its answer cannot be read. A retry would replay the same answer.
		o := Outcome{Kind: Sent, HTTPStatus: status}
		ref := ""
		if !oversize {
			ref = c.readRef(data)
		}
		if !plainRef(ref) {
			o.Reason = "accepted, but the response carries no readable message id"
			return o
		}
		o.Ref = ref
		return o
	}

	code := 0
	reason := http.StatusText(status)
	if !oversize {
		fields := c.errorFields
		if fields == nil {
			fields = genericErrorFields
		}
		if n, text, ok := fields(data); ok {
			code = n
			if text != "" {
				reason = scrubFor(text, m)
			}
		}
	}
	if reason == "" {
		reason = "unexpected status"
	}
	o := Outcome{HTTPStatus: status, Code: code, Reason: reason}
	switch {
	case code != 0 && code == c.expiredCode && status >= 400 && status < 500 && !mayFollowTaken(status):
		// The provider refused the message as expired on arrival: it
		// took nothing, and no later attempt may be made.
		o.Kind = Expired
	case code != 0 && slices.Contains(c.optOut, code) && status >= 400 && status < 500 &&
		(!mayFollowTaken(status) || slices.Contains(c.optOutStatuses, status)):
		// The recipient opted out: nothing was taken, and no provider
		// may be called for the number (the suppression list).
		o.Kind, o.OptedOut = Permanent, true
	case code != 0 && slices.Contains(c.permanent, code) && !mayFollowTaken(status):
		// A permanent code is believed only on an answer that says the
		// provider took nothing. On one that may follow a message it took
		// (a 5xx after sending, a gateway's 408 or 502 carrying an
		// upstream error) the status's doubt wins and the answer is
		// classified below by its status: "dead" would tell the
		// application the user got nothing, and dead is only for rows the
		// provider never took.
		o.Kind = Permanent
	case slices.Contains(c.refused, status):
		o.Kind = Retry
	case status == 429:
		// A rate limit is enforced at the door, by the provider or by a
		// gateway in front of it, before the request is processed:
		// nothing was taken (the generic API's contract says so of its
		// 503 too). The row still waits for the same provider: a limit
		// is flow control, not a failure (docs/providers.md).
		o.Kind = Retry
		o.After = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now(), c.cfg.MaxRetryAfter)
	case status == 408 || status == 409 || status == 425:
		// Each of these may follow a message the provider took, whatever
		// the provider does with keys. A 409 says another request with
		// this key is being processed: that one may be taken. A 408 or a
		// 425 may come from a gateway in front of the provider (a load
		// balancer, an API gateway, a corporate proxy) after it forwarded
		// the request and gave up waiting; and sendonce never sends early
		// data, so a 425 is no answer RFC 8470 explains, only someone's
		// misuse of it. So the message may be taken (MaybeAccepted): the
		// row stays with this provider, which alone knows the key, and
		// never moves to another (docs/providers.md, failover). Where the
		// provider honours the key, a retry under it is safe and replays
		// whatever it did; a provider that ignores keys would send again,
		// so the answer is ambiguous there, and is looked up before
		// anything is sent again.
		o.MaybeAccepted = true
		o.Kind = Retry
		if !c.cfg.Idempotent {
			o.Kind = Ambiguous
		}
	case status >= 500:
		// A 5xx may come after the message was taken: the provider failed
		// after sending, or a gateway answers 500, 502 or 504 for a request
		// it forwarded. Only the generic API's 503 says by contract that
		// nothing was processed (docs/design.md): the message may go to
		// another provider. An adapter's 503 promises nothing (its API
		// documents no such contract) and is ambiguous below.
		o.MaybeAccepted = status != 503
		if !c.cfg.Idempotent {
			// The provider may have sent before failing, and would send again.
			o.Kind = Ambiguous
			break
		}
		o.Kind = Retry
		if status == 503 {
			o.After = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now(), c.cfg.MaxRetryAfter)
		}
	default:
		// 400, 401, 403, 404, 422 and every other 4xx, and the 1xx and 3xx
		// a client that follows no redirects must not see: a retry would
		// get the same answer.
		o.Kind = Permanent
	}
	return o
}

// mayFollowTaken reports whether an error status may answer a request the
// provider took, whatever it does with keys: 408, 409, 425 and every 5xx
// (classify says why of each). Such an answer is classified by its status,
// never by a permanent code it carries.
func mayFollowTaken(status int) bool {
	return status == 408 || status == 409 || status == 425 || status >= 500
}

// readRef reads the message id of a success answer: refOf's, or the
// top-level refField's; "" when there is none.
func (c *Client) readRef(data []byte) string {
	if c.refOf != nil {
		return c.refOf(data)
	}
	var ok map[string]json.RawMessage
	var ref string
	if json.Unmarshal(data, &ok) != nil || json.Unmarshal(ok[c.refField], &ref) != nil {
		return ""
	}
	return ref
}

// describe names a transport error without echoing URLs' query strings or
// anything the provider sent.
func describe(err error) string {
	var ne net.Error
	var opErr *net.OpError
	switch {
	// Before the context checks: a dial timeout also matches
	// context.DeadlineExceeded (net's timeout error says so).
	case errors.As(err, &opErr) && opErr.Op == "dial":
		if opErr.Timeout() {
			return "connect timeout"
		}
		return "connect failed: " + scrub(opErr.Err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "connection closed by the provider"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return scrub(ue.Err.Error())
	}
	return scrub(err.Error())
}

// scrub makes provider text safe to log and store. The text is normalised
// first (safetext.Normalize: NFKC, so full-width digits, NBSP, thin spaces
// and the like become plain digits and spaces; %-escaped separators decoded;
// control, C1 and format characters such as bidi overrides dropped to
// spaces), then every run of four or more digits (any script's) becomes "#":
// a one-time code echoed from the body, or a phone number however it is
// written, since up to three characters that are neither letters nor digits
// between two digits ("+1 - 555 - 123 - 4567", "555/123_4567",
// "555%20123%204567") count as separators within one run. The result is cut
// to 200 bytes.
func scrub(s string) string { return scrubFor(s, Message{}) }

// scrubFor is scrub for text a provider answered about the message m: what
// it echoes of m's body is removed first (redact), and a run of three
// digits m's number holds is masked as well.
func scrubFor(s string, m Message) string {
	s = safetext.Normalize(s)
	if len(s) > maxScrubIn {
		s = strings.ToValidUTF8(s[:maxScrubIn], "")
	}
	s = safetext.MaskNumbers(redact(s, m), safetext.Digits(m.To))
	if len(s) > 200 {
		s = s[:200]
	}
	return strings.ToValidUTF8(s, "")
}

// maxScrubIn bounds the provider text scrubbed, in bytes: the result keeps
// at most 200, and redact's cost grows with the length.
const maxScrubIn = 8 << 10

// bodyGram is the length, in characters, of the pieces of a body that redact
// looks for: any stretch of provider text made of such pieces is the body
// echoed, whole or in part (truncated, re-cased, with its number masked by
// the provider), and is removed. Shorter fragments are too common to tell
// from the provider's own words.
const bodyGram = 6

// redact removes what the provider echoes of the message's own body from
// text normalised by safetext.Normalize, replacing each stretch with
// "[body]": a provider that echoes the request must not leak it into
// last_error or a dead letter, whatever the body holds. Comparison ignores
// case and the kind of space. The number is masked by scrubFor.
func redact(s string, m Message) string {
	if m.Body == "" || s == "" {
		return s
	}
	body := fold(safetext.Normalize(m.Body))
	text := []rune(s)
	folded := fold(s)
	covered := make([]bool, len(text))
	if len(body) < bodyGram {
		if len(body) < 3 {
			return s
		}
		for i := 0; i+len(body) <= len(folded); i++ {
			if string(folded[i:i+len(body)]) == string(body) {
				for j := i; j < i+len(body); j++ {
					covered[j] = true
				}
			}
		}
	} else {
		grams := make(map[string]struct{}, len(body))
		for i := 0; i+bodyGram <= len(body); i++ {
			grams[string(body[i:i+bodyGram])] = struct{}{}
		}
		for i := 0; i+bodyGram <= len(folded); i++ {
			if _, ok := grams[string(folded[i:i+bodyGram])]; ok {
				for j := i; j < i+bodyGram; j++ {
					covered[j] = true
				}
			}
		}
	}
	var b strings.Builder
	for i := 0; i < len(text); i++ {
		if !covered[i] {
			b.WriteRune(text[i])
			continue
		}
		if i == 0 || !covered[i-1] {
			b.WriteString("[body]")
		}
	}
	return b.String()
}

// fold lower-cases s and makes every space a plain one, rune for rune.
func fold(s string) []rune {
	rs := []rune(s)
	for i, r := range rs {
		if unicode.IsSpace(r) {
			rs[i] = ' '
		} else {
			rs[i] = unicode.ToLower(r)
		}
	}
	return rs
}

// plainRef reports whether a provider message id is fit to store: 1..200
// printable ASCII characters.
func plainRef(ref string) bool {
	if ref == "" || len(ref) > 200 {
		return false
	}
	for i := 0; i < len(ref); i++ {
		if ref[i] < 0x21 || ref[i] > 0x7e {
			return false
		}
	}
	return true
}
