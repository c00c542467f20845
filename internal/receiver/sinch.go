package receiver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
)

// The headers of a signed Sinch SMS callback (Sinch's Node SDK,
// @sinch/sms SmsCallbackWebhooks.validateAuthenticationHeader).
const (
	HeaderSinchSignature = "X-Sinch-Webhook-Signature"
	HeaderSinchNonce     = "X-Sinch-Webhook-Signature-Nonce"
	HeaderSinchTimestamp = "X-Sinch-Webhook-Signature-Timestamp"
	HeaderSinchAlgorithm = "X-Sinch-Webhook-Signature-Algorithm"
)

// SignSinch returns the X-Sinch-Webhook-Signature of body with nonce and
// timestamp (unix seconds) under secret: the base64 HMAC-SHA256 of
// "<body>.<nonce>.<timestamp>".
func SignSinch(secret, body []byte, nonce, timestamp string) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	m.Write([]byte("." + nonce + "." + timestamp))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// VerifySinch checks a signed Sinch SMS callback: the signature header is
// the base64 HMAC-SHA256, under the callback secret, of the raw body, the
// nonce and the timestamp joined by dots (SignSinch); the algorithm, when
// named, is HmacSHA256. The signature is compared first, in constant time,
// then the timestamp: within tolerance of now, against a replayed callback
// (Sinch's SDK checks no time; the signed timestamp lets the receiver).
func VerifySinch(secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	sig, err := base64.StdEncoding.DecodeString(h.Get(HeaderSinchSignature))
	nonce, ts := h.Get(HeaderSinchNonce), h.Get(HeaderSinchTimestamp)
	if len(secret) == 0 || err != nil || len(sig) != sha256.Size || nonce == "" || ts == "" {
		return ErrForged
	}
	if alg := h.Get(HeaderSinchAlgorithm); alg != "" && !strings.EqualFold(alg, "HmacSHA256") {
		return ErrForged
	}
	want, _ := base64.StdEncoding.DecodeString(SignSinch(secret, body, nonce, ts))
	if !hmac.Equal(want, sig) {
		return ErrForged
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrStale
	}
	if d := now.Sub(time.Unix(t, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	return nil
}

// sinch serves POST /v1/receipts/sinch, a Sinch SMS delivery report per
// recipient (the adapter asks for delivery_report "per_recipient"):
// {"type":"recipient_delivery_report_sms","batch_id","recipient","code",
// "status","at","client_reference"}, the row found by client_reference
// (the sender sends the row id). Batch-level reports ("delivery_report_sms",
// counts without recipients) are answered and ignored: they name no single
// message. An inbound message (mo_text) is taken as at /v1/inbound/sinch.
func (rv *Receiver) sinch(w http.ResponseWriter, r *http.Request) {
	body, ok := rv.readBody(w, r, rv.receipts("sinch"))
	if !ok {
		return
	}
	if err := VerifySinch(rv.cfg.SinchSecret, r.Header, body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, rv.receipts("sinch"), err)
		return
	}
	var v struct {
		Type            string      `json:"type"`
		BatchID         string      `json:"batch_id"`
		ClientReference string      `json:"client_reference"`
		Status          string      `json:"status"`
		Code            json.Number `json:"code"`
		At              string      `json:"at"`
		From            string      `json:"from"`
		Body            string      `json:"body"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		rv.malformed(w, rv.receipts("sinch"), "receipt is not the expected JSON")
		return
	}
	if v.Type == "mo_text" || v.Type == "mo_binary" {
		// A service plan's callback URL gets its inbound messages too.
		rv.sinchKeyword(w, r, sinchInbound{Type: v.Type, From: v.From, Body: v.Body})
		return
	}
	if v.Type != "recipient_delivery_report_sms" {
		rv.metrics.count("sinch", "ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	rc := outbox.Receipt{Source: "sinch", ProviderRef: plainRef(v.BatchID)}
	// The statuses of the document's "Delivery reports" tag.
	switch strings.ToLower(v.Status) {
	case "delivered":
		rc.Status = outbox.StatusDelivered
	case "aborted", "rejected", "deleted", "failed", "expired", "cancelled", "canceled":
		// Final, and the phone has nothing: aborted before the SMSC,
		// rejected or deleted by it, failed, expired before delivery,
		// canceled before it reached the SMSC.
		rc.Status = outbox.StatusUndelivered
	case "queued", "dispatched":
		// Sinch has it (queued, or taken by the SMSC): not its fate.
		rc.Status = outbox.StatusSent
	default:
		// Unknown (no receipt from the SMSC), or a status Sinch adds
		// later: nothing to learn; answered so that it is not sent again.
		rv.metrics.count("sinch", "ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	if v.Code != "" {
		if n, err := v.Code.Int64(); err == nil && n > 0 && n < 1<<31 {
			rc.Code = int(n)
		}
	}
	if v.At != "" {
		at, err := time.Parse(time.RFC3339Nano, v.At)
		if err != nil {
			rv.malformed(w, rv.receipts("sinch"), "at must be an ISO 8601 time")
			return
		}
		rc.At = at
	}
	rv.apply(w, r, rc, v.ClientReference)
}
