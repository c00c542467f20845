package receiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

var sinchSecret = []byte("sinch-callback-secret-0123456789")

// sinchCase is one callback for the Node signer (tools/node).
type sinchCase struct {
	Body      string `json:"body"`
	Timestamp string `json:"timestamp,omitempty"`
	SignWith  string `json:"sign_with,omitempty"`
}

type sinchSigned struct {
	Headers     map[string]string `json:"headers"`
	SDKVerified bool              `json:"sdk_verified"`
}

// signSinch has tools/node/sign-sinch-callback.js sign each case as Sinch
// signs its callbacks, and Sinch's SDK say whether it is validly signed.
func signSinch(t *testing.T, cases []sinchCase) []sinchSigned {
	t.Helper()
	in, _ := json.Marshal(cases)
	out := nodetools.Node(t, "sign-sinch-callback.js", in, []string{"SINCH_CALLBACK_SECRET=" + string(sinchSecret)})
	var signed []sinchSigned
	if err := json.Unmarshal([]byte(out), &signed); err != nil || len(signed) != len(cases) {
		t.Fatalf("signer answered %q: %v", out, err)
	}
	return signed
}

// sinchReport is a delivery report per recipient, as the document's
// retrieveRecipientDeliveryResponseObj gives it.
func sinchReport(ref, status string, code int) string {
	b, _ := json.Marshal(map[string]any{
		"type": "recipient_delivery_report_sms", "batch_id": "01FC66621VHDBN119Z8PMV1" + ref[len(ref)-3:],
		"recipient": "15551234567", "code": code, "status": status, "at": "2026-01-02T14:00:00.000Z",
		"operator_status_at": "2026-01-02T13:59:58Z", "client_reference": ref,
	})
	return string(b)
}

func (f *fixture) postSinch(body string, h map[string]string) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/receipts/sinch", bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
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

// Sinch's delivery reports, signed by Sinch's algorithm and checked by its
// SDK: genuine ones move their rows (found by client_reference); forged,
// altered, unsigned and stale ones change nothing.
func TestSinchReceipts(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *receiver.Config) { c.TwilioToken, c.SinchSecret, c.DefaultProvider = "", sinchSecret, "sinch" })
	sending, unknown, failed, untouched := f.row("sending"), f.row("unknown"), f.row("sending"), f.row("sent")
	now := time.Now().Unix()
	altered := sinchReport(untouched.String(), "Delivered", 0)
	batch, _ := json.Marshal(map[string]any{"type": "delivery_report_sms", "batch_id": "01FC66621VHDBN119Z8PMV1QPQ",
		"statuses": []any{map[string]any{"code": 0, "status": "Delivered", "count": 1}}, "client_reference": untouched.String()})
	tests := []struct {
		name       string
		send       string // the body posted; the signature signs c.Body
		c          sinchCase
		sdk        bool // what Sinch's SDK says of the signature
		code       int
		result     string
		id         uuid.UUID
		wantStatus string
	}{
		{name: "dispatched: Sinch has it", c: sinchCase{Body: sinchReport(sending.String(), "Dispatched", 401)}, sdk: true, code: 200, result: "applied", id: sending, wantStatus: "sent"},
		{name: "delivered", c: sinchCase{Body: sinchReport(sending.String(), "Delivered", 0)}, sdk: true, code: 200, result: "applied", id: sending, wantStatus: "delivered"},
		{name: "the same again", c: sinchCase{Body: sinchReport(sending.String(), "Delivered", 0)}, sdk: true, code: 200, result: "unchanged", id: sending, wantStatus: "delivered"},
		{name: "an unknown row settled", c: sinchCase{Body: sinchReport(unknown.String(), "Queued", 400)}, sdk: true, code: 200, result: "settled_unknown", id: unknown, wantStatus: "sent"},
		{name: "aborted: unroutable", c: sinchCase{Body: sinchReport(failed.String(), "Aborted", 402)}, sdk: true, code: 200, result: "applied", id: failed, wantStatus: "undelivered"},
		{name: "unknown status", c: sinchCase{Body: sinchReport(untouched.String(), "Unknown", 0)}, sdk: true, code: 200, result: "ignored", id: untouched, wantStatus: "sent"},
		{name: "a batch report", c: sinchCase{Body: string(batch)}, sdk: true, code: 200, result: "ignored", id: untouched, wantStatus: "sent"},
		{name: "no such row", c: sinchCase{Body: sinchReport(uuid.NewString(), "Delivered", 0)}, sdk: true, code: 200, result: "unknown_reference"},
		{name: "forged: another secret", c: sinchCase{Body: altered, SignWith: "not-the-callback-secret-0123456"}, sdk: false, code: 401, id: untouched, wantStatus: "sent"},
		{name: "altered body", send: altered, c: sinchCase{Body: sinchReport(untouched.String(), "Dispatched", 401)}, sdk: true, code: 401, id: untouched, wantStatus: "sent"},
		{name: "stale", c: sinchCase{Body: altered, Timestamp: strconv.FormatInt(now-301, 10)}, sdk: true, code: 401, id: untouched, wantStatus: "sent"},
		{name: "unsigned", send: altered, code: 401, id: untouched, wantStatus: "sent"},
	}
	var cases []sinchCase
	for _, tt := range tests {
		cases = append(cases, tt.c)
	}
	signed := signSinch(t, cases)
	for i, tt := range tests {
		body, h := tt.c.Body, signed[i].Headers
		if tt.send != "" {
			body = tt.send
		}
		if tt.c.Body == "" {
			h = nil
		} else if signed[i].SDKVerified != tt.sdk {
			t.Errorf("%s: Sinch's SDK says the signature is valid: %v, want %v", tt.name, signed[i].SDKVerified, tt.sdk)
		}
		code, result := f.postSinch(body, h)
		if code != tt.code || (tt.result != "" && result != tt.result) {
			t.Errorf("%s: %d %q, want %d %q", tt.name, code, result, tt.code, tt.result)
		}
		if tt.id != uuid.Nil {
			if st, _ := f.status(tt.id); st != tt.wantStatus {
				t.Errorf("%s: row is %s, want %s", tt.name, st, tt.wantStatus)
			}
		}
	}
	// The row settled by a receipt keeps Sinch's batch id and the report's
	// code as evidence.
	if _, ref := f.status(failed); ref != "01FC66621VHDBN119Z8PMV1"+failed.String()[33:] {
		t.Errorf("failed row's provider_ref %q", ref)
	}
	var code int
	if err := f.admin.QueryRow(context.Background(), `SELECT code FROM sms_evidence WHERE outbox_id = $1 AND source = 'sinch' AND result = 'undelivered'`, failed).Scan(&code); err != nil || code != 402 {
		t.Errorf("failed row's evidence code %d (%v), want 402", code, err)
	}
	if n := f.evidence(untouched); n != 0 {
		t.Errorf("refused or ignored receipts left %d evidence rows", n)
	}
	for result, want := range map[string]float64{"applied": 3, "forged": 3, "stale": 1, "ignored": 2, "settled_unknown": 1} {
		if got := f.count("sinch", result); got != want {
			t.Errorf("sendonce_receipts_total{source=sinch,result=%s} = %v, want %v", result, got, want)
		}
	}
}

func TestVerifySinchEdges(t *testing.T) {
	t.Parallel()
	body := []byte(`{"type":"recipient_delivery_report_sms","status":"Delivered"}`)
	now := time.Unix(1_800_000_000, 0)
	ts := "1800000000"
	good := func() http.Header {
		h := http.Header{}
		h.Set(receiver.HeaderSinchSignature, receiver.SignSinch(sinchSecret, body, "N1", ts))
		h.Set(receiver.HeaderSinchNonce, "N1")
		h.Set(receiver.HeaderSinchTimestamp, ts)
		h.Set(receiver.HeaderSinchAlgorithm, "HmacSHA256")
		return h
	}
	for _, tt := range []struct {
		name string
		edit func(http.Header)
		want error
	}{
		{"genuine", func(http.Header) {}, nil},
		{"no algorithm named", func(h http.Header) { h.Del(receiver.HeaderSinchAlgorithm) }, nil},
		{"another algorithm", func(h http.Header) { h.Set(receiver.HeaderSinchAlgorithm, "HmacSHA1") }, receiver.ErrForged},
		{"another nonce", func(h http.Header) { h.Set(receiver.HeaderSinchNonce, "N2") }, receiver.ErrForged},
		{"no nonce", func(h http.Header) { h.Del(receiver.HeaderSinchNonce) }, receiver.ErrForged},
		{"another timestamp", func(h http.Header) { h.Set(receiver.HeaderSinchTimestamp, "1800000001") }, receiver.ErrForged},
		{"signed, from the future", func(h http.Header) {
			h.Set(receiver.HeaderSinchTimestamp, "1800000400")
			h.Set(receiver.HeaderSinchSignature, receiver.SignSinch(sinchSecret, body, "N1", "1800000400"))
		}, receiver.ErrStale},
		{"signed, not a number", func(h http.Header) {
			h.Set(receiver.HeaderSinchTimestamp, "yesterday")
			h.Set(receiver.HeaderSinchSignature, receiver.SignSinch(sinchSecret, body, "N1", "yesterday"))
		}, receiver.ErrStale},
		{"garbage signature", func(h http.Header) { h.Set(receiver.HeaderSinchSignature, "!!") }, receiver.ErrForged},
		{"no signature", func(h http.Header) { h.Del(receiver.HeaderSinchSignature) }, receiver.ErrForged},
	} {
		h := good()
		tt.edit(h)
		if err := receiver.VerifySinch(sinchSecret, h, body, now, receiver.DefaultTolerance); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := receiver.VerifySinch(nil, good(), body, now, receiver.DefaultTolerance); !errors.Is(err, receiver.ErrForged) {
		t.Errorf("an empty secret verified a callback: %v", err)
	}
}
