package receiver

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
)

// Telnyx's webhook signature headers: the base64 Ed25519 signature of
// "<timestamp>|<raw body>", and the timestamp (Unix seconds) it covers.
const (
	HeaderTelnyxSignature = "Telnyx-Signature-Ed25519"
	HeaderTelnyxTimestamp = "Telnyx-Timestamp"
)

// ParseTelnyxPublicKey reads the account's webhook public key as Telnyx's
// portal gives it: 32 bytes in base64. The error never holds the value.
func ParseTelnyxPublicKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("a Telnyx public key is 32 bytes in base64")
	}
	return ed25519.PublicKey(b), nil
}

// VerifyTelnyx checks a signed Telnyx webhook, as Telnyx's SDKs verify
// them (telnyx-node, src/lib/webhooks.ts, TelnyxWebhook.verify): the
// Telnyx-Signature-Ed25519 header is the base64 Ed25519 signature, under
// the account's key pair, of the Telnyx-Timestamp header's value, '|' and
// the raw body; the timestamp (Unix seconds) must be within tolerance of
// now. The signature is checked first, then the time, so that a forged
// webhook learns nothing from the answer.
func VerifyTelnyx(pub ed25519.PublicKey, signature, timestamp string, body []byte, now time.Time, tolerance time.Duration) error {
	if len(pub) != ed25519.PublicKeySize || signature == "" || timestamp == "" {
		return ErrForged
	}
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(signature))
	if err != nil || len(sig) != ed25519.SignatureSize {
		return ErrForged
	}
	msg := make([]byte, 0, len(timestamp)+1+len(body))
	msg = append(append(append(msg, timestamp...), '|'), body...)
	if !ed25519.Verify(pub, msg, sig) {
		return ErrForged
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		// Signed, but not a time: nothing says when.
		return ErrStale
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	return nil
}

// telnyx serves POST /v1/receipts/telnyx, a Messaging webhook (the
// OutboundMessageEvent of Telnyx's OpenAPI document):
//
//	{"data":{"event_type":"message.finalized","occurred_at":"...",
//	 "payload":{"id":"<message id>","direction":"outbound",
//	  "to":[{"status":"delivered"}],"errors":[{"code":"40001"}],
//	  "webhook_url":"https://.../v1/receipts/telnyx?ref=<row id>"}}}
//
// The row is found by the ref in the payload's webhook_url, the URL the
// sender asked for (Telnyx echoes it in every webhook of the message, and
// the signature covers the body); the request's own URL is not signed, so
// its query is not trusted.
func (rv *Receiver) telnyx(w http.ResponseWriter, r *http.Request) {
	body, ok := rv.readBody(w, r, rv.receipts("telnyx"))
	if !ok {
		return
	}
	if err := VerifyTelnyx(rv.cfg.TelnyxPublicKey, r.Header.Get(HeaderTelnyxSignature), r.Header.Get(HeaderTelnyxTimestamp), body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, rv.receipts("telnyx"), err)
		return
	}
	var v struct {
		Data struct {
			EventType  string `json:"event_type"`
			OccurredAt string `json:"occurred_at"`
			Payload    struct {
				ID        string `json:"id"`
				Direction string `json:"direction"`
				To        []struct {
					Status string `json:"status"`
				} `json:"to"`
				Errors []struct {
					Code json.RawMessage `json:"code"`
				} `json:"errors"`
				WebhookURL string `json:"webhook_url"`
			} `json:"payload"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		rv.malformed(w, rv.receipts("telnyx"), "webhook is not the expected JSON")
		return
	}
	if v.Data.EventType == "message.received" {
		// A messaging profile's webhook URL gets its inbound messages too.
		var m telnyxInbound
		if err := json.Unmarshal(body, &m); err != nil {
			rv.malformed(w, rv.inbound("telnyx"), "webhook is not the expected JSON")
			return
		}
		rv.telnyxKeyword(w, r, m)
		return
	}
	p := v.Data.Payload
	switch {
	case v.Data.EventType != "message.sent" && v.Data.EventType != "message.finalized",
		p.Direction != "" && p.Direction != "outbound",
		len(p.To) == 0:
		// Not a status of a message we sent (an inbound message, another
		// product's event): nothing to learn; answered so that it is not
		// sent again.
		rv.metrics.count("telnyx", "ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	rc := outbox.Receipt{Source: "telnyx", ProviderRef: plainRef(p.ID)}
	// The document's statuses of a recipient (OutboundMessagePayload.to[]):
	// the sender sends to one number, the first.
	switch strings.ToLower(p.To[0].Status) {
	case "delivered":
		rc.Status = outbox.StatusDelivered
	case "delivery_failed", "sending_failed", "expired":
		// delivery_failed: the carrier could not deliver it; sending_failed:
		// Telnyx could not hand it to the carrier; expired: its validity
		// ran out first. The phone has nothing.
		rc.Status = outbox.StatusUndelivered
	case "queued", "sending", "sent", "delivery_unconfirmed":
		// Evidence that Telnyx has the message, not of its fate
		// (delivery_unconfirmed: finalized without the carrier's report).
		rc.Status = outbox.StatusSent
	default:
		// A status Telnyx adds later, or none.
		rv.metrics.count("telnyx", "ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	if len(p.Errors) > 0 {
		if n, err := strconv.Atoi(strings.Trim(string(p.Errors[0].Code), `"`)); err == nil && n > 0 && n < 1<<31 {
			rc.Code = n
		}
	}
	if v.Data.OccurredAt != "" {
		at, err := time.Parse(time.RFC3339Nano, v.Data.OccurredAt)
		if err != nil {
			rv.malformed(w, rv.receipts("telnyx"), "occurred_at must be an ISO 8601 time")
			return
		}
		rc.At = at
	}
	rv.apply(w, r, rc, telnyxReference(p.WebhookURL))
}

// telnyxReference is the row id the sender put in a message's webhook_url
// (its ref query parameter); "" when there is none.
func telnyxReference(webhookURL string) string {
	u, err := url.Parse(webhookURL)
	if err != nil || !strings.HasSuffix(u.Path, "/v1/receipts/telnyx") {
		return ""
	}
	return u.Query().Get("ref")
}
