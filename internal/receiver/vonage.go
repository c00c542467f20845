package receiver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
)

// HeaderVonageAuthorization carries Vonage's signature of a Messages API
// webhook: "Bearer <JWT>".
const HeaderVonageAuthorization = "Authorization"

// VerifyVonage checks a signed Messages API webhook (Vonage's "signed
// webhooks"): the Authorization header is "Bearer <JWT>", an HS256 JWT
// signed with the account's signature secret, whose payload_hash claim is
// the hex SHA-256 of the raw body and whose iat is when Vonage signed it.
// The signature is checked first (in constant time; only HS256: a token
// that names another algorithm, "none" included, is forged), then the
// payload hash, then the time: iat within tolerance of now, and exp, when
// the token has one, not passed. A forged token learns nothing from the
// answer of the checks after the signature.
func VerifyVonage(secret []byte, authorization string, body []byte, now time.Time, tolerance time.Duration) error {
	token, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok || len(secret) == 0 {
		return ErrForged
	}
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 {
		return ErrForged
	}
	head, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	sig, err2 := base64.RawURLEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil {
		return ErrForged
	}
	var h struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(head, &h) != nil || h.Alg != "HS256" {
		return ErrForged
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(parts[0] + "." + parts[1]))
	if !hmac.Equal(m.Sum(nil), sig) {
		return ErrForged
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ErrForged
	}
	var c struct {
		PayloadHash string   `json:"payload_hash"`
		IAT         *float64 `json:"iat"`
		EXP         *float64 `json:"exp"`
	}
	if json.Unmarshal(payload, &c) != nil {
		return ErrForged
	}
	sum := sha256.Sum256(body)
	got, err := hex.DecodeString(c.PayloadHash)
	if err != nil || !hmac.Equal(got, sum[:]) {
		// Signed, but not over this body: altered on the way.
		return ErrForged
	}
	if c.IAT == nil || math.IsNaN(*c.IAT) || math.IsInf(*c.IAT, 0) {
		return ErrStale
	}
	iat := time.Unix(int64(*c.IAT), 0)
	if d := now.Sub(iat); d > tolerance || d < -tolerance {
		return ErrStale
	}
	if c.EXP != nil && !now.Before(time.Unix(int64(*c.EXP), 0)) {
		return ErrStale
	}
	return nil
}

// vonage serves POST /v1/receipts/vonage, a Messages API status webhook
// (v1 format): {"message_uuid","to","from","timestamp","status",
// "channel","client_ref","error":{"type","title","detail"}}, the row found
// by client_ref (the sender sends the row id).
func (rv *Receiver) vonage(w http.ResponseWriter, r *http.Request) {
	body, ok := rv.readBody(w, r, rv.receipts("vonage"))
	if !ok {
		return
	}
	if err := VerifyVonage(rv.cfg.VonageSecret, r.Header.Get(HeaderVonageAuthorization), body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, rv.receipts("vonage"), err)
		return
	}
	var v struct {
		MessageUUID string `json:"message_uuid"`
		ClientRef   string `json:"client_ref"`
		Status      string `json:"status"`
		Channel     string `json:"channel"`
		Timestamp   string `json:"timestamp"`
		Error       struct {
			Type  string          `json:"type"`
			Title json.RawMessage `json:"title"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		rv.malformed(w, rv.receipts("vonage"), "receipt is not the expected JSON")
		return
	}
	if v.Channel != "" && v.Channel != "sms" {
		// Not an SMS of ours (the application may serve other channels).
		rv.metrics.count("vonage", "ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	rc := outbox.Receipt{Source: "vonage", ProviderRef: plainRef(v.MessageUUID)}
	switch strings.ToLower(v.Status) {
	case "delivered", "read":
		rc.Status = outbox.StatusDelivered
	case "rejected", "undeliverable", "failed":
		// rejected: Vonage or the carrier refused it; undeliverable: the
		// carrier could not deliver it. Either way the phone has nothing.
		rc.Status = outbox.StatusUndelivered
	case "submitted", "accepted":
		// Evidence that Vonage has the message, not of its fate.
		rc.Status = outbox.StatusSent
	default:
		// A status Vonage adds later, or none: nothing to learn; answered
		// so that it is not sent again.
		rv.metrics.count("vonage", "ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	rc.Code = vonageCode(v.Error.Title, v.Error.Type)
	if v.Timestamp != "" {
		at, err := time.Parse(time.RFC3339Nano, v.Timestamp)
		if err != nil {
			rv.malformed(w, rv.receipts("vonage"), "timestamp must be an ISO 8601 time")
			return
		}
		rc.At = at
	}
	rv.apply(w, r, rc, v.ClientRef)
}

// vonageCode is a status webhook's error code: its error's title (a code,
// as a string or a number) or, failing that, its type URL's numeric
// fragment (".../messages-olympus#1320"); 0 when neither is one.
func vonageCode(title json.RawMessage, typ string) int {
	s := strings.Trim(string(title), `"`)
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 1<<31 {
		return n
	}
	if _, frag, ok := strings.Cut(typ, "#"); ok {
		if n, err := strconv.Atoi(frag); err == nil && n > 0 && n < 1<<31 {
			return n
		}
	}
	return 0
}
