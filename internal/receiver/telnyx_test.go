package receiver_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

// telnyxCase is one webhook for the Node signer (tools/node).
type telnyxCase struct {
	Body      string `json:"body"`
	Send      string `json:"send,omitempty"`
	Timestamp int64  `json:"timestamp,omitempty"`
	OtherKey  bool   `json:"other_key,omitempty"`
}

type telnyxSigned struct {
	Signature   string `json:"signature"`
	Timestamp   string `json:"timestamp"`
	SDKVerified bool   `json:"sdk_verified"`
}

// signTelnyx has tools/node/sign-telnyx-webhook.js sign each case as Telnyx
// signs its webhooks, under a key pair it makes, and Telnyx's SDK say
// whether each verifies; it returns the account's public key too.
func signTelnyx(t *testing.T, cases []telnyxCase) (ed25519.PublicKey, []telnyxSigned) {
	t.Helper()
	in, _ := json.Marshal(cases)
	out := nodetools.Node(t, "sign-telnyx-webhook.js", in, nil)
	var ans struct {
		PublicKey string         `json:"public_key"`
		Webhooks  []telnyxSigned `json:"webhooks"`
	}
	if err := json.Unmarshal([]byte(out), &ans); err != nil || len(ans.Webhooks) != len(cases) {
		t.Fatalf("signer answered %q: %v", out, err)
	}
	pub, err := receiver.ParseTelnyxPublicKey(ans.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pub, ans.Webhooks
}

// telnyxEvent is a Messaging webhook in the shape of the document's
// OutboundMessageEvent, for a message the sender sent for row ref (its
// webhook_url), to one number with status.
func telnyxEvent(ref, eventType, status string, errCode string) string {
	webhook := provider.TelnyxReceiptsURL("https://receipts.example.com", ref)
	if ref == "" {
		webhook = "https://profile.example.com/hooks"
	}
	errs := []map[string]any{}
	if errCode != "" {
		errs = append(errs, map[string]any{"code": errCode, "title": "Not routable",
			"detail": "The destination number is either a landline or a non-routable wireless number."})
	}
	id := "40385f64-5717-4562-b3fc-2c963f66afa6"
	if len(ref) >= 12 {
		id = "40385f64-5717-4562-b3fc-" + ref[len(ref)-12:]
	}
	m := map[string]any{
		"data": map[string]any{
			"event_type": eventType, "id": "86f58db9-0fe3-4adc-9d1f-46e66e6e9323",
			"occurred_at": "2026-01-02T14:00:00.000+00:00", "record_type": "event",
			"payload": map[string]any{
				"id": id, "record_type": "message", "direction": "outbound", "type": "SMS",
				"from": map[string]any{"phone_number": "+15550001111", "carrier": "TELNYX LLC", "line_type": "VoIP"},
				"to":   []map[string]any{{"phone_number": "+15551234567", "status": status, "carrier": "T-MOBILE USA, INC.", "line_type": "Wireless"}},
				"text": "Your code is 482901", "parts": 1, "errors": errs,
				"webhook_url": webhook, "webhook_failover_url": nil, "use_profile_webhooks": false,
			},
		},
		"meta": map[string]any{"attempt": 1, "delivered_to": webhook},
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// rowWithID inserts a row with id, as row does.
func (f *fixture) rowWithID(id uuid.UUID, status string) {
	f.t.Helper()
	reason := map[string]any{"unknown": "ambiguous", "dead": "permanent"}[status]
	if _, err := f.admin.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status, end_reason, attempt_count)
		VALUES ($1, '+15551234567', 'Your code is 482901', $2, $3, CASE WHEN $2 = 'pending' THEN 0 ELSE 1 END)`, id, status, reason); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) postTelnyx(query, body, signature, timestamp string) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/receipts/telnyx"+query, bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	if signature != "" {
		req.Header.Set("telnyx-signature-ed25519", signature)
	}
	if timestamp != "" {
		req.Header.Set("telnyx-timestamp", timestamp)
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

// Telnyx's Messaging webhooks, signed by Telnyx's documented algorithm and
// checked by its SDK: genuine ones move their rows (found by the ref in
// the signed payload's webhook_url) as the other providers' receipts do;
// forged, altered, stale, unsigned ones change nothing, nor does a ref in
// the request's own (unsigned) URL.
func TestTelnyxReceipts(t *testing.T) {
	t.Parallel()
	// The rows are made after the signing (the key pair is the signer's),
	// so their ids are chosen now.
	sending, unknown, failed, unconfirmed, untouched := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	now := time.Now().Unix()
	altered := telnyxEvent(untouched.String(), "message.finalized", "delivered", "")
	tests := []struct {
		name       string
		query      string // the request URL's query
		c          telnyxCase
		noSig      bool
		noTS       bool
		sdk        bool // what Telnyx's SDK says of the webhook as posted
		code       int
		result     string
		id         uuid.UUID
		wantStatus string
	}{
		{name: "sent: Telnyx has it", c: telnyxCase{Body: telnyxEvent(sending.String(), "message.sent", "sent", "")}, sdk: true, code: 200, result: "applied", id: sending, wantStatus: "sent"},
		{name: "delivered", c: telnyxCase{Body: telnyxEvent(sending.String(), "message.finalized", "delivered", "")}, sdk: true, code: 200, result: "applied", id: sending, wantStatus: "delivered"},
		{name: "the same again", c: telnyxCase{Body: telnyxEvent(sending.String(), "message.finalized", "delivered", "")}, sdk: true, code: 200, result: "unchanged", id: sending, wantStatus: "delivered"},
		{name: "an unknown row settled", c: telnyxCase{Body: telnyxEvent(unknown.String(), "message.finalized", "delivery_failed", "40001")}, sdk: true, code: 200, result: "settled_unknown", id: unknown, wantStatus: "undelivered"},
		{name: "sending failed", c: telnyxCase{Body: telnyxEvent(failed.String(), "message.finalized", "sending_failed", "40008")}, sdk: true, code: 200, result: "applied", id: failed, wantStatus: "undelivered"},
		{name: "delivery unconfirmed", c: telnyxCase{Body: telnyxEvent(unconfirmed.String(), "message.finalized", "delivery_unconfirmed", "")}, sdk: true, code: 200, result: "applied", id: unconfirmed, wantStatus: "sent"},
		{name: "no such row", c: telnyxCase{Body: telnyxEvent(uuid.NewString(), "message.finalized", "delivered", "")}, sdk: true, code: 200, result: "unknown_reference"},
		{name: "a profile's webhook, no ref", c: telnyxCase{Body: telnyxEvent("", "message.finalized", "delivered", "")}, sdk: true, code: 200, result: "unknown_reference"},
		{name: "a ref in the URL only", query: "?ref=" + untouched.String(), c: telnyxCase{Body: telnyxEvent("", "message.finalized", "delivered", "")}, sdk: true, code: 200, result: "unknown_reference", id: untouched, wantStatus: "sent"},
		{name: "an inbound message", c: telnyxCase{Body: strings.Replace(telnyxEvent(untouched.String(), "message.received", "webhook_delivered", ""), `"outbound"`, `"inbound"`, 1)}, sdk: true, code: 200, result: "ignored", id: untouched, wantStatus: "sent"},
		{name: "forged: another key", c: telnyxCase{Body: altered, OtherKey: true}, sdk: false, code: 401, result: "missing or wrong signature", id: untouched, wantStatus: "sent"},
		{name: "altered body", c: telnyxCase{Body: telnyxEvent(untouched.String(), "message.sent", "sent", ""), Send: altered}, sdk: false, code: 401, id: untouched, wantStatus: "sent"},
		{name: "stale", c: telnyxCase{Body: altered, Timestamp: now - 301}, sdk: false, code: 401, result: "signature time outside the tolerance", id: untouched, wantStatus: "sent"},
		{name: "from the future", c: telnyxCase{Body: altered, Timestamp: now + 360}, sdk: false, code: 401, id: untouched, wantStatus: "sent"},
		{name: "no signature", c: telnyxCase{Body: altered}, noSig: true, sdk: true, code: 401, id: untouched, wantStatus: "sent"},
		{name: "no timestamp", c: telnyxCase{Body: altered}, noTS: true, sdk: true, code: 401, id: untouched, wantStatus: "sent"},
	}
	var cases []telnyxCase
	for _, tt := range tests {
		cases = append(cases, tt.c)
	}
	pub, signed := signTelnyx(t, cases)
	f := start(t, func(c *receiver.Config) { c.Secrets, c.TwilioToken, c.TelnyxPublicKey = nil, "", pub })
	for _, id := range []uuid.UUID{sending, failed, unconfirmed} {
		f.rowWithID(id, "sending")
	}
	f.rowWithID(unknown, "unknown")
	f.rowWithID(untouched, "sent")
	for i, tt := range tests {
		body, s := tt.c.Body, signed[i]
		if tt.c.Send != "" {
			body = tt.c.Send
		}
		if s.SDKVerified != tt.sdk {
			t.Errorf("%s: Telnyx's SDK says the webhook verifies: %v, want %v", tt.name, s.SDKVerified, tt.sdk)
		}
		sig, ts := s.Signature, s.Timestamp
		if tt.noSig {
			sig = ""
		}
		if tt.noTS {
			ts = ""
		}
		code, result := f.postTelnyx(tt.query, body, sig, ts)
		if code != tt.code || (tt.result != "" && result != tt.result) {
			t.Errorf("%s: %d %q, want %d %q", tt.name, code, result, tt.code, tt.result)
		}
		if tt.id != uuid.Nil {
			if st, _ := f.status(tt.id); st != tt.wantStatus {
				t.Errorf("%s: row is %s, want %s", tt.name, st, tt.wantStatus)
			}
		}
	}
	// The row settled by a receipt keeps Telnyx's message id and the
	// error's code as evidence.
	if _, ref := f.status(unknown); ref != "40385f64-5717-4562-b3fc-"+unknown.String()[24:] {
		t.Errorf("settled row's provider_ref %q", ref)
	}
	var code int
	if err := f.admin.QueryRow(context.Background(), `SELECT code FROM sms_evidence WHERE outbox_id = $1 AND source = 'telnyx' AND result = 'undelivered'`, unknown).Scan(&code); err != nil || code != 40001 {
		t.Errorf("settled row's evidence code %d (%v), want 40001", code, err)
	}
	if n := f.evidence(untouched); n != 0 {
		t.Errorf("refused and ignored webhooks left %d evidence rows", n)
	}
	// The inbound message is taken as one (a profile's webhook URL gets
	// both): no keyword, nothing kept.
	if n := f.inboundCount("telnyx", "ignored"); n != 1 {
		t.Errorf("sendonce_inbound_total{source=telnyx,result=ignored} = %v, want 1", n)
	}
	for result, want := range map[string]float64{"applied": 4, "unchanged": 1, "settled_unknown": 1, "unknown_reference": 3, "ignored": 0, "forged": 4, "stale": 2} {
		if got := f.count("telnyx", result); got != want {
			t.Errorf("sendonce_receipts_total{source=telnyx,result=%s} = %v, want %v", result, got, want)
		}
	}
}

// The receiver serves /v1/receipts/telnyx only with a key, and takes a
// Telnyx key alone.
func TestTelnyxEndpointNeedsAKey(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *receiver.Config) { c.TwilioToken = "" })
	if code, _ := f.postTelnyx("", `{}`, "", ""); code != http.StatusNotFound {
		t.Errorf("without a Telnyx key: %d, want 404", code)
	}
	pub, _, _ := ed25519.GenerateKey(nil)
	g := start(t, func(c *receiver.Config) { c.Secrets, c.TwilioToken, c.TelnyxPublicKey = nil, "", pub })
	if code, _ := g.postTelnyx("", `{}`, "", ""); code != http.StatusUnauthorized {
		t.Errorf("with a Telnyx key alone, an unsigned webhook: %d, want 401", code)
	}
	if _, err := receiver.New(receiver.Config{Pool: g.admin, TelnyxPublicKey: pub[:31]}); err == nil {
		t.Error("a 31-byte Telnyx key was taken")
	}
}

func TestVerifyTelnyxEdges(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"data":{"event_type":"message.finalized"}}`)
	now := time.Unix(1_800_000_000, 0)
	sign := func(ts string, b []byte) string {
		return base64.StdEncoding.EncodeToString(ed25519.Sign(priv, append([]byte(ts+"|"), b...)))
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	for _, tt := range []struct {
		name, sig, ts string
		want          error
	}{
		{"genuine", sign(ts, body), ts, nil},
		{"299 s old", sign("1799999701", body), "1799999701", nil},
		{"301 s old", sign("1799999699", body), "1799999699", receiver.ErrStale},
		{"signed over another timestamp", sign("1799999999", body), ts, receiver.ErrForged},
		{"signed without the separator", base64.StdEncoding.EncodeToString(ed25519.Sign(priv, append([]byte(ts), body...))), ts, receiver.ErrForged},
		{"signature not base64", "not base64!", ts, receiver.ErrForged},
		{"signature cut short", sign(ts, body)[:40], ts, receiver.ErrForged},
		{"timestamp not a number, signed", sign("soon", body), "soon", receiver.ErrStale},
		{"empty", "", "", receiver.ErrForged},
	} {
		if err := receiver.VerifyTelnyx(pub, tt.sig, tt.ts, body, now, receiver.DefaultTolerance); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := receiver.VerifyTelnyx(nil, sign(ts, body), ts, body, now, receiver.DefaultTolerance); !errors.Is(err, receiver.ErrForged) {
		t.Errorf("no key verified a webhook: %v", err)
	}
	for _, s := range []string{"", "abc", base64.StdEncoding.EncodeToString(make([]byte, 31)), base64.StdEncoding.EncodeToString(make([]byte, 33))} {
		if _, err := receiver.ParseTelnyxPublicKey(s); err == nil {
			t.Errorf("ParseTelnyxPublicKey(%q) took it", s)
		}
	}
	if k, err := receiver.ParseTelnyxPublicKey(" " + base64.StdEncoding.EncodeToString(pub) + "\n"); err != nil || !k.Equal(pub) {
		t.Errorf("ParseTelnyxPublicKey of a genuine key: %v", err)
	}
}
