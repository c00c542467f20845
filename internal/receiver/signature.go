package receiver

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// HeaderSignature carries a generic receipt's signature:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>". More
// than one v1 may be given (a provider rotating its secret signs with both).
const HeaderSignature = "Sendonce-Signature"

// HeaderTwilioSignature carries Twilio's signature of a status callback.
const HeaderTwilioSignature = "X-Twilio-Signature"

// DefaultTolerance is how far a generic receipt's t may be from now.
const DefaultTolerance = 300 * time.Second

// ErrForged and ErrStale are VerifyGeneric's refusals: a signature that is
// missing, malformed or wrong; and a correct one whose time is out of the
// tolerance (a replayed receipt).
var (
	ErrForged = errors.New("missing or wrong signature")
	ErrStale  = errors.New("signature time outside the tolerance")
)

// SignGeneric returns the Sendonce-Signature header value for body signed
// with secret at t.
func SignGeneric(secret, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(genericMAC(secret, ts, body))
}

func genericMAC(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// VerifyGeneric checks header, a Sendonce-Signature, against body: one of
// its v1 values must be the HMAC of "t.body" under one of secrets (compared
// in constant time), and t within tolerance of now. The time is checked after
// the signature, so that a forged header learns nothing from the answer.
func VerifyGeneric(secrets [][]byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil && len(b) == sha256.Size {
				sigs = append(sigs, b)
			}
		}
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrForged
	}
	ok := false
	for _, secret := range secrets {
		want := genericMAC(secret, ts, body)
		for _, sig := range sigs {
			// Every pair is compared, so that the time taken says nothing
			// of which matched.
			if hmac.Equal(want, sig) {
				ok = true
			}
		}
	}
	if !ok {
		return ErrForged
	}
	if d := now.Sub(time.Unix(t, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	return nil
}

// SignTwilio returns Twilio's X-Twilio-Signature for a request to fullURL
// (as Twilio called it, query string included) with the form params: the
// base64 HMAC-SHA1, under the auth token, of the URL followed by every
// param's name and value, sorted by name (and a repeated name's distinct
// values sorted).
func SignTwilio(token, fullURL string, params url.Values) string {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	m := hmac.New(sha1.New, []byte(token))
	m.Write([]byte(fullURL))
	for _, k := range keys {
		// A name's values sorted, and each once (as Twilio's own
		// libraries sign them).
		vs := slices.Clone(params[k])
		slices.Sort(vs)
		vs = slices.Compact(vs)
		for _, v := range vs {
			m.Write([]byte(k))
			m.Write([]byte(v))
		}
	}
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// VerifyTwilio checks a Twilio signature in constant time.
func VerifyTwilio(token, fullURL string, params url.Values, signature string) error {
	got, err := base64.StdEncoding.DecodeString(signature)
	if err != nil || len(got) != sha1.Size {
		return ErrForged
	}
	want, _ := base64.StdEncoding.DecodeString(SignTwilio(token, fullURL, params))
	if !hmac.Equal(want, got) {
		return ErrForged
	}
	return nil
}
