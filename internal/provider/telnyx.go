package provider

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// TelnyxConfig configures the Telnyx adapter (Messaging, API v2).
type TelnyxConfig struct {
	// BaseURL is the API's base URL; default https://api.telnyx.com.
	// Messages are POSTed to BaseURL/v2/messages.
	BaseURL string
	// APIKey is the API v2 key, sent as a Bearer token; required.
	APIKey string
	// From is the sending number (+E.164), alphanumeric sender id or short
	// code. MessagingProfileID is the messaging profile to send with (a
	// number pool, or required by Telnyx with an alphanumeric sender id).
	// At least one is required; both are sent when both are set.
	From, MessagingProfileID string
	// ReceiptsURL, when set, asks Telnyx for the message's webhooks at
	// ReceiptsURL/v1/receipts/telnyx?ref=<row id> (webhook_url), and for
	// those alone (use_profile_webhooks false). Telnyx echoes webhook_url
	// in every webhook's signed payload, which is how a receipt names its
	// row. Empty leaves webhooks to the messaging profile.
	ReceiptsURL string
	// Lookup must be false: Telnyx cannot be asked for a message by our
	// reference, so NewTelnyx refuses it.
	Lookup bool
	// Timeout, ConnectTimeout, PermanentCodes, MaxConns, MaxRetryAfter and
	// Transport are as in Config.
	Timeout, ConnectTimeout time.Duration
	PermanentCodes          []int
	MaxConns                int
	MaxRetryAfter           time.Duration
	Transport               http.RoundTripper
}

// TelnyxReceiptsPath is where the Telnyx adapter asks for webhooks, under
// the receiver's public URL; the row id follows in the query (ref).
const TelnyxReceiptsPath = "/v1/receipts/telnyx"

// NewTelnyx returns a client for Telnyx's Messaging API (v2):
// POST {BaseURL}/v2/messages with the JSON body
//
//	{"to":"+15551234567","from":"+15550001111","messaging_profile_id":"...",
//	 "text":"...","webhook_url":".../v1/receipts/telnyx?ref=<row id>",
//	 "use_profile_webhooks":false}
//
// and "Authorization: Bearer <API key>", answered 200
// {"data":{"id":"<message id>",...}} or an error
// {"errors":[{"code":"10015","title":"...","detail":"..."}]}. The shape is
// that of Telnyx's published OpenAPI document (openapi/spec3.yml of the
// team-telnyx/openapi repository, operation SendMessage and its
// CreateMessageRequest, MessageResponse and Errors schemas;
// internal/provider/testdata/telnyx has it, and a conformance test checks
// every request against it). The document gives the send no field for a
// reference of ours: the row id travels in webhook_url's query instead,
// and comes back in each webhook's payload.
//
// Nor does it give the send a field for a message's validity or expiry:
// a message's expiry is not sent (docs/providers.md, "Expiry").
//
// Telnyx honours no idempotency key on this operation: its API reference
// declares Idempotency-Key per endpoint (developers.telnyx.com, "API
// fundamentals: Idempotency": "Use this header on endpoints whose API
// reference declares Idempotency-Key support"), and SendMessage declares
// none, in the document kept here and in the newer ones published since.
// So the client always runs in non-idempotent mode: an attempt that may
// have reached Telnyx and lost its answer is Ambiguous (the row ends
// unknown unless a receipt arrives), never retried.
//
// The document gives the send a 200 and a "default" error answer (the
// Errors schema) and no list of statuses, so answers are classified by
// their HTTP status under Client's rules, which agree with Telnyx's error
// references (developers.telnyx.com, "API error codes" and "Messaging
// error code reference"):
//   - 200: Sent, data.id the Ref.
//   - 400 (10015 bad request, 10016 a number not +E.164, 40310 an invalid
//     'to', 40305 an invalid 'from'), 401 (10009 authentication failed),
//     403 (10010 authorization failed), 404, 422 and any other 4xx:
//     Permanent; the same request gets the same answer.
//   - 429 (10011 too many requests): Retry, after Retry-After when given;
//     nothing was sent.
//   - 40300 ("Blocked due to STOP message", answered 409): Permanent and
//     OptedOut; the recipient opted out (optout.go).
//   - 500 (10007 unexpected error) and every other 5xx: Ambiguous (Telnyx
//     may have taken the message before failing); 408 (10008 request
//     timeout), 409 and 425 likewise, as for any provider without
//     idempotency.
//
// An error's code is the first error's code (a string of digits in the
// document, e.g. "10015"), which SMS_PERMANENT_CODES may name. The 40xxx
// delivery errors come in webhooks, not here.
func NewTelnyx(cfg TelnyxConfig) (*Client, error) {
	a := adapter{name: "telnyx", base: "https://api.telnyx.com", path: "/v2/messages"}
	c, err := a.newClient(Config{BaseURL: cfg.BaseURL, ReceiptsURL: cfg.ReceiptsURL, Timeout: cfg.Timeout, ConnectTimeout: cfg.ConnectTimeout,
		PermanentCodes: cfg.PermanentCodes, MaxConns: cfg.MaxConns, MaxRetryAfter: cfg.MaxRetryAfter, Transport: cfg.Transport},
		a.required("APIKey", cfg.APIKey),
		a.required("From or MessagingProfileID", cfg.From, cfg.MessagingProfileID),
		rule{cfg.Lookup, ErrTelnyxNoLookup})
	if err != nil {
		return nil, err
	}
	c.auth = "Bearer " + cfg.APIKey
	c.refOf = telnyxRef
	c.errorFields = telnyxErrorFields
	c.optOutStatuses = []int{http.StatusConflict}
	c.newRequest = func(ctx context.Context, m Message, _ time.Time) (*http.Request, error) {
		to, err := telnyxNumber(m.To)
		if err != nil {
			return nil, err
		}
		req := struct {
			To                 string `json:"to"`
			From               string `json:"from,omitempty"`
			MessagingProfileID string `json:"messaging_profile_id,omitempty"`
			Text               string `json:"text"`
			WebhookURL         string `json:"webhook_url,omitempty"`
			UseProfileWebhooks *bool  `json:"use_profile_webhooks,omitempty"`
		}{To: to, From: cfg.From, MessagingProfileID: cfg.MessagingProfileID, Text: m.Body}
		if cfg.ReceiptsURL != "" {
			// Our webhook alone: the profile's would be tried after it
			// (the document's use_profile_webhooks), and would get
			// events the operator asked to come here.
			req.WebhookURL = TelnyxReceiptsURL(cfg.ReceiptsURL, m.Key)
			no := false
			req.UseProfileWebhooks = &no
		}
		return c.postJSON(ctx, req)
	}
	return c, nil
}

// TelnyxReceiptsURL is the webhook_url the adapter sends for the row ref:
// base/v1/receipts/telnyx?ref=<ref>.
func TelnyxReceiptsURL(base, ref string) string {
	return receiptsAt(base, TelnyxReceiptsPath+"?ref="+url.QueryEscape(ref))
}

// telnyxNumber writes an E.164 number as Telnyx takes it: '+' and 7 to 15
// digits, the first not 0 (the document's "+E.164"). The error never holds
// the number.
func telnyxNumber(e164 string) (string, error) {
	d, err := e164Digits(e164)
	if err != nil {
		return "", err
	}
	return "+" + d, nil
}

// telnyxRef reads the message id of a send's answer (the document's
// MessageResponse): data.id.
func telnyxRef(data []byte) string {
	var r struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(data, &r) != nil {
		return ""
	}
	return r.Data.ID
}

// telnyxErrorFields reads a Telnyx error answer (the document's Errors
// schema): {"errors":[{"code":"10015","title":"Bad Request","detail":"..."}]}.
// The code is the first error's, a string of digits (a number is taken
// too); 0 when it is neither.
func telnyxErrorFields(data []byte) (int, string, bool) {
	var e struct {
		Errors []struct {
			Code   json.RawMessage `json:"code"`
			Title  string          `json:"title"`
			Detail string          `json:"detail"`
		} `json:"errors"`
	}
	if json.Unmarshal(data, &e) != nil || len(e.Errors) == 0 {
		return 0, "", false
	}
	first := e.Errors[0]
	return errorCode(string(first.Code)), errorText(first.Title, first.Detail), true
}
