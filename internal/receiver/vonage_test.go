package receiver_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

var vonageSecret = []byte("vonage-signature-secret-0123456789")

// vonageCase is one token for the Node signer (tools/node).
type vonageCase struct {
	Body        string `json:"body"`
	IAT         int64  `json:"iat,omitempty"`
	EXP         int64  `json:"exp,omitempty"`
	PayloadHash string `json:"payload_hash,omitempty"`
	SignWith    string `json:"sign_with,omitempty"`
}

type vonageToken struct {
	Token       string `json:"token"`
	SDKVerified bool   `json:"sdk_verified"`
}

// signVonage has tools/node/sign-vonage-webhook.js sign each case as Vonage
// signs its webhooks, and Vonage's SDK say whether it is validly signed.
func signVonage(t *testing.T, cases []vonageCase) []vonageToken {
	t.Helper()
	in, _ := json.Marshal(cases)
	out := nodetools.Node(t, "sign-vonage-webhook.js", in, []string{"VONAGE_SIGNATURE_SECRET=" + string(vonageSecret)})
	var toks []vonageToken
	if err := json.Unmarshal([]byte(out), &toks); err != nil || len(toks) != len(cases) {
		t.Fatalf("signer answered %q: %v", out, err)
	}
	return toks
}

func vonageStatus(ref, status, channel string) string {
	m := map[string]any{
		"message_uuid": "aaaaaaaa-bbbb-cccc-dddd-" + ref[len(ref)-12:], "to": "15551234567", "from": "Acme",
		"timestamp": "2026-01-02T14:00:00.000Z", "status": status, "channel": channel, "client_ref": ref,
		"usage": map[string]string{"currency": "EUR", "price": "0.0333"},
	}
	if status == "rejected" || status == "undeliverable" {
		m["error"] = map[string]any{"type": "https://developer.nexmo.com/api-errors/messages-olympus#1320", "title": 1320,
			"detail": "Message already sent", "instance": "bf0ca0bf927b3b52e3cb03217e1a1ddf"}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func (f *fixture) postVonage(body, token string) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/receipts/vonage", bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans struct{ Result string }
	_ = json.NewDecoder(resp.Body).Decode(&ans)
	return resp.StatusCode, ans.Result
}

// Vonage's status webhooks, signed by Vonage's documented algorithm and
// checked by its SDK: genuine ones move their rows (found by client_ref)
// as the generic and Twilio receipts do; forged, altered, unsigned, stale
// and expired ones change nothing.
func TestVonageReceipts(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *receiver.Config) {
		c.TwilioToken, c.VonageSecret, c.DefaultProvider = "", vonageSecret, "vonage"
	})
	sending, unknown, rejected, untouched := f.row("sending"), f.row("unknown"), f.row("sending"), f.row("sent")
	now := time.Now().Unix()

	altered := vonageStatus(untouched.String(), "delivered", "sms")
	tests := []struct {
		name       string
		send       string // the body posted; the token signs c.Body
		c          vonageCase
		sdk        bool // what Vonage's SDK says of the token's signature
		code       int
		result     string
		id         uuid.UUID
		wantStatus string
	}{
		{name: "submitted: Vonage has it", c: vonageCase{Body: vonageStatus(sending.String(), "submitted", "sms")}, sdk: true, code: 200, result: "applied", id: sending, wantStatus: "sent"},
		{name: "delivered", c: vonageCase{Body: vonageStatus(sending.String(), "delivered", "sms")}, sdk: true, code: 200, result: "applied", id: sending, wantStatus: "delivered"},
		{name: "the same again", c: vonageCase{Body: vonageStatus(sending.String(), "delivered", "sms")}, sdk: true, code: 200, result: "unchanged", id: sending, wantStatus: "delivered"},
		{name: "an unknown row settled", c: vonageCase{Body: vonageStatus(unknown.String(), "undeliverable", "sms")}, sdk: true, code: 200, result: "settled_unknown", id: unknown, wantStatus: "undelivered"},
		{name: "rejected", c: vonageCase{Body: vonageStatus(rejected.String(), "rejected", "sms")}, sdk: true, code: 200, result: "applied", id: rejected, wantStatus: "undelivered"},
		{name: "no such row", c: vonageCase{Body: vonageStatus(uuid.NewString(), "delivered", "sms")}, sdk: true, code: 200, result: "unknown_reference"},
		{name: "another channel", c: vonageCase{Body: vonageStatus(untouched.String(), "delivered", "whatsapp")}, sdk: true, code: 200, result: "ignored", id: untouched, wantStatus: "sent"},
		{name: "forged: another secret", c: vonageCase{Body: altered, SignWith: "not-the-signature-secret-0123456"}, sdk: false, code: 401, id: untouched, wantStatus: "sent"},
		{name: "altered body", send: altered, c: vonageCase{Body: vonageStatus(untouched.String(), "submitted", "sms")}, sdk: true, code: 401, id: untouched, wantStatus: "sent"},
		{name: "a hash of another body", c: vonageCase{Body: altered, PayloadHash: hex.EncodeToString(make([]byte, 32))}, sdk: true, code: 401, id: untouched, wantStatus: "sent"},
		{name: "stale", c: vonageCase{Body: altered, IAT: now - 301}, sdk: true, code: 401, id: untouched, wantStatus: "sent"},
		{name: "expired", c: vonageCase{Body: altered, IAT: now - 60, EXP: now - 1}, sdk: false, code: 401, id: untouched, wantStatus: "sent"},
		{name: "unsigned", send: altered, code: 401, id: untouched, wantStatus: "sent"},
	}
	var cases []vonageCase
	for _, tt := range tests {
		cases = append(cases, tt.c)
	}
	toks := signVonage(t, cases)
	for i, tt := range tests {
		body, tok := tt.c.Body, toks[i]
		if tt.send != "" {
			body = tt.send
		}
		token := tok.Token
		if tt.c.Body == "" {
			token = ""
		} else if tok.SDKVerified != tt.sdk {
			t.Errorf("%s: Vonage's SDK says the signature is valid: %v, want %v", tt.name, tok.SDKVerified, tt.sdk)
		}
		code, result := f.postVonage(body, token)
		if code != tt.code || (tt.result != "" && result != tt.result) {
			t.Errorf("%s: %d %q, want %d %q", tt.name, code, result, tt.code, tt.result)
		}
		if tt.id != uuid.Nil {
			if st, _ := f.status(tt.id); st != tt.wantStatus {
				t.Errorf("%s: row is %s, want %s", tt.name, st, tt.wantStatus)
			}
		}
	}
	// The row settled by a receipt keeps Vonage's message UUID and the
	// error's code as evidence.
	if _, ref := f.status(rejected); ref != "aaaaaaaa-bbbb-cccc-dddd-"+rejected.String()[24:] {
		t.Errorf("rejected row's provider_ref %q", ref)
	}
	var code int
	if err := f.admin.QueryRow(context.Background(), `SELECT code FROM sms_evidence WHERE outbox_id = $1 AND source = 'vonage' AND result = 'undelivered'`, rejected).Scan(&code); err != nil || code != 1320 {
		t.Errorf("rejected row's evidence code %d (%v), want 1320", code, err)
	}
	if n := f.evidence(untouched); n != 0 {
		t.Errorf("refused receipts left %d evidence rows", n)
	}
	for result, want := range map[string]float64{"applied": 3, "forged": 4, "stale": 2, "ignored": 1, "settled_unknown": 1} {
		if got := f.count("vonage", result); got != want {
			t.Errorf("sendonce_receipts_total{source=vonage,result=%s} = %v, want %v", result, got, want)
		}
	}
}

// hs256 signs claims as a JWT with header, for VerifyVonage's edges.
func hs256(header, claims string, secret []byte) string {
	enc := base64.RawURLEncoding.EncodeToString
	signing := enc([]byte(header)) + "." + enc([]byte(claims))
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(signing))
	return signing + "." + enc(m.Sum(nil))
}

func TestVerifyVonageEdges(t *testing.T) {
	t.Parallel()
	body := []byte(`{"status":"delivered"}`)
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	now := time.Unix(1_800_000_000, 0)
	claims := `{"iat":1800000000,"payload_hash":"` + hash + `"}`
	for _, tt := range []struct {
		name, auth string
		want       error
	}{
		{"genuine", "Bearer " + hs256(`{"alg":"HS256","typ":"JWT"}`, claims, vonageSecret), nil},
		{"alg none", "Bearer " + hs256(`{"alg":"none"}`, claims, vonageSecret), receiver.ErrForged},
		{"alg none, no signature", "Bearer " + base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".", receiver.ErrForged},
		{"RS256 named", "Bearer " + hs256(`{"alg":"RS256"}`, claims, vonageSecret), receiver.ErrForged},
		{"no Bearer", hs256(`{"alg":"HS256"}`, claims, vonageSecret), receiver.ErrForged},
		{"no payload hash", "Bearer " + hs256(`{"alg":"HS256"}`, `{"iat":1800000000}`, vonageSecret), receiver.ErrForged},
		{"no iat", "Bearer " + hs256(`{"alg":"HS256"}`, `{"payload_hash":"`+hash+`"}`, vonageSecret), receiver.ErrStale},
		{"from the future", "Bearer " + hs256(`{"alg":"HS256"}`, `{"iat":1800000400,"payload_hash":"`+hash+`"}`, vonageSecret), receiver.ErrStale},
		{"garbage", "Bearer a.b.c", receiver.ErrForged},
		{"empty", "", receiver.ErrForged},
	} {
		if err := receiver.VerifyVonage(vonageSecret, tt.auth, body, now, receiver.DefaultTolerance); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := receiver.VerifyVonage(nil, "Bearer "+hs256(`{"alg":"HS256"}`, claims, nil), body, now, receiver.DefaultTolerance); !errors.Is(err, receiver.ErrForged) {
		t.Errorf("an empty secret verified a token: %v", err)
	}
}
