package provider

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// VonageConfig configures the Vonage adapter (the Messages API, v1).
type VonageConfig struct {
	// BaseURL is the API's base URL; default https://api.nexmo.com.
	// Messages are POSTed to BaseURL/v1/messages.
	BaseURL string
	// APIKey and APISecret are the basic-auth credentials; required.
	APIKey, APISecret string
	// From is the sending number (digits, no '+') or alphanumeric sender
	// id; required.
	From string
	// ReceiptsURL, when set, asks Vonage for status webhooks at
	// ReceiptsURL/v1/receipts/vonage for each message (webhook_url, in the
	// v1 format: webhook_version). Empty leaves them to the Vonage
	// application's or account's status URL.
	ReceiptsURL string
	// Lookup must be false: the Messages API cannot be asked for a message
	// by our reference (client_ref), so New refuses it.
	Lookup bool
	// Timeout, ConnectTimeout, PermanentCodes, MaxConns, MaxRetryAfter and
	// Transport are as in Config.
	Timeout, ConnectTimeout time.Duration
	PermanentCodes          []int
	MaxConns                int
	MaxRetryAfter           time.Duration
	Transport               http.RoundTripper
}

// NewVonage returns a client for Vonage's Messages API:
// POST {BaseURL}/v1/messages with the JSON body
//
//	{"message_type":"text","channel":"sms","to":"447700900000","from":"...",
//	 "text":"...","client_ref":"<row id>","webhook_url":"...","webhook_version":"v1"}
//
// with basic auth (API key and secret), answered 202 {"message_uuid":"..."}
// or an error {"type":"<URL>#<code>","title","detail","instance"}. The shape
// is that of Vonage's published OpenAPI document of the Messages API
// (definitions/messages-olympus.yml, version 1.4.0, of Vonage's
// api-specification repository; internal/provider/testdata/vonage has it,
// and a conformance test checks every request against it). webhook_url and
// webhook_version are not in that version of the document; Vonage's Node
// SDK (@vonage/messages, MessageParams) documents them.
//
// A message's expiry is not sent: the document gives an SMS no validity
// (its ttl is Viber's), and the SMS API's ttl is another API's
// (docs/providers.md, "Expiry").
//
// Vonage honours no idempotency key, so the client always runs in
// non-idempotent mode: an attempt that may have reached Vonage and lost its
// answer is Ambiguous (the row ends unknown unless a receipt arrives),
// never retried.
//
// Answers are classified by the statuses that document lists for the send
// operation (SendMessage's responses, and the Error* schemas):
//   - 202: Sent, message_uuid the Ref.
//   - 401 (missing or invalid credentials, an application without the
//     product) and 422 (invalid JSON, channel, sender, recipient, message
//     type or parameters, client reference): Permanent; the same request
//     gets the same answer.
//   - 402 (low balance): Retry; nothing was sent, and a later attempt may
//     find the account topped up.
//   - 429 (throttled, "Please wait, then retry your request"): Retry,
//     after Retry-After when given; nothing was sent.
//   - 500 (internal error) and every other 5xx: Ambiguous (Vonage may have
//     taken the message before failing); 408, 409 and 425 likewise, as for
//     any provider without idempotency (Client's rules).
//   - any other status: Permanent, as Client's rules.
//
// The code of an error is the numeric fragment of its type URL (the
// document's x-errors, e.g. #1120 "Illegal Sender Address"), which
// SMS_PERMANENT_CODES may name; #1240 (a recipient who opted out) is
// Permanent and OptedOut, though Vonage reports it in the status webhook
// rather than in an answer (optout.go).
func NewVonage(cfg VonageConfig) (*Client, error) {
	a := adapter{name: "vonage", base: "https://api.nexmo.com", path: "/v1/messages"}
	c, err := a.newClient(Config{BaseURL: cfg.BaseURL, ReceiptsURL: cfg.ReceiptsURL, Timeout: cfg.Timeout, ConnectTimeout: cfg.ConnectTimeout,
		PermanentCodes: cfg.PermanentCodes, MaxConns: cfg.MaxConns, MaxRetryAfter: cfg.MaxRetryAfter, Transport: cfg.Transport},
		a.required("APIKey", cfg.APIKey),
		a.required("APISecret", cfg.APISecret),
		a.required("From", cfg.From),
		rule{cfg.Lookup, ErrVonageNoLookup})
	if err != nil {
		return nil, err
	}
	from := strings.TrimPrefix(cfg.From, "+")
	c.auth = basicAuth(cfg.APIKey, cfg.APISecret)
	c.refField = "message_uuid"
	c.errorFields = vonageErrorFields
	// 402 (low balance) is a refusal before anything was sent: the same
	// message goes through once the account is topped up.
	c.refused = []int{http.StatusPaymentRequired}
	c.newRequest = func(ctx context.Context, m Message, _ time.Time) (*http.Request, error) {
		// The document's ToNumber: the digits alone, without '+' or 00.
		to, err := e164Digits(m.To)
		if err != nil {
			return nil, err
		}
		req := struct {
			MessageType    string `json:"message_type"`
			Channel        string `json:"channel"`
			To             string `json:"to"`
			From           string `json:"from"`
			Text           string `json:"text"`
			ClientRef      string `json:"client_ref"`
			WebhookURL     string `json:"webhook_url,omitempty"`
			WebhookVersion string `json:"webhook_version,omitempty"`
		}{MessageType: "text", Channel: "sms", To: to, From: from, Text: m.Body, ClientRef: m.Key}
		if cfg.ReceiptsURL != "" {
			req.WebhookURL = receiptsAt(cfg.ReceiptsURL, VonageReceiptsPath)
			req.WebhookVersion = "v1"
		}
		return c.postJSON(ctx, req)
	}
	return c, nil
}

// vonageErrorFields reads a Messages API error answer (RFC 7807 style, the
// document's Error* schemas): {"type":"https://developer.nexmo.com/api-errors/messages-olympus#1120",
// "title":"Invalid sender","detail":"...","instance":"..."}. The code is
// the type's numeric fragment (the document's x-errors); types such as
// "#low-balance" or "#unathorized" carry none.
func vonageErrorFields(data []byte) (int, string, bool) {
	var e struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	if json.Unmarshal(data, &e) != nil {
		return 0, "", false
	}
	code := 0
	if _, frag, ok := strings.Cut(e.Type, "#"); ok {
		code = errorCode(frag)
	}
	return code, errorText(e.Title, e.Detail), true
}

// VonageReceiptsPath is where the Vonage adapter asks for status webhooks,
// under the receiver's public URL.
const VonageReceiptsPath = "/v1/receipts/vonage"
