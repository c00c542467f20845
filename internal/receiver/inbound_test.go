package receiver_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

// listed returns the suppression list's entries: number -> source/provider/reason.
func (f *fixture) listed() map[string]string {
	f.t.Helper()
	rows, err := f.admin.Query(context.Background(), `SELECT number, source || '/' || coalesce(provider, '') || '/' || reason FROM sms_suppressions`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, what string
		if err := rows.Scan(&n, &what); err != nil {
			f.t.Fatal(err)
		}
		out[n] = what
	}
	return out
}

// inboundCount reads sendonce_inbound_total for source and result.
func (f *fixture) inboundCount(source, result string) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sendonce_inbound_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["source"] == source && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// postInbound posts body to /v1/inbound/<provider> with headers, and
// returns the status and the body answered.
func (f *fixture) postInbound(provider, contentType string, body []byte, h http.Header) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/inbound/"+provider, bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A STOP signed as each provider signs its inbound webhooks (by its
// official SDK or its documented algorithm, as the SDK checks it) puts the
// sender's number on the list, from that provider; a START lifts it; a
// reply that is no keyword is answered and not kept; a forged, altered or
// stale STOP is refused (401) and lists nothing.
func TestInboundKeywordsFromEveryProvider(t *testing.T) {
	t.Parallel()
	const public = "https://receipts.example.com"
	now := time.Now()
	type msg struct{ provider, from, text string }
	body := func(m msg) []byte {
		var v any
		switch m.provider {
		case "generic":
			v = map[string]string{"id": "in_1", "from": m.from, "to": "+15550001111", "text": m.text}
		case "vonage":
			v = map[string]any{"channel": "sms", "message_uuid": "aaaaaaaa-bbbb-cccc-dddd-0123456789ab", "to": "15550001111",
				"from": strings.TrimPrefix(m.from, "+"), "timestamp": now.UTC().Format(time.RFC3339), "text": m.text,
				"sms": map[string]string{"num_messages": "1", "keyword": strings.ToUpper(m.text)}}
		case "sinch":
			v = map[string]any{"type": "mo_text", "id": "01FC66621VHDBN119Z8PMV1QPA", "from": m.from, "to": "+15550001111",
				"body": m.text, "received_at": now.UTC().Format(time.RFC3339)}
		case "telnyx":
			v = map[string]any{"data": map[string]any{"event_type": "message.received", "id": "bf6307bd-884d-4c1f-b6ea-c62b8c495d3c",
				"occurred_at": now.UTC().Format(time.RFC3339), "record_type": "event",
				"payload": map[string]any{"direction": "inbound", "type": "SMS", "text": m.text,
					"from": map[string]any{"phone_number": m.from, "carrier": "T-MOBILE USA, INC.", "line_type": "Wireless"},
					"to":   []map[string]any{{"phone_number": "+15550001111", "status": "webhook_delivered"}}}}}
		}
		b, _ := json.Marshal(v)
		return b
	}
	twilioForm := func(m msg) url.Values {
		return url.Values{"MessageSid": {"SM0123456789abcdef0123456789abcdef"}, "AccountSid": {"AC0123456789abcdef0123456789abcdef"},
			"From": {m.from}, "To": {"+15550001111"}, "Body": {m.text}, "NumMedia": {"0"}, "SmsStatus": {"received"}, "ApiVersion": {"2010-04-01"}}
	}
	// What each case posts, and what it must do.
	type kase struct {
		m      msg
		forge  string // "", "key" (another secret), "stale", "altered" (signed another text)
		code   int
		result string
	}
	var cases []kase
	for i, p := range []string{"generic", "twilio", "vonage", "sinch", "telnyx"} {
		stop, lift, help, forged := "+1555000010"+strconv.Itoa(i), "+1555000020"+strconv.Itoa(i), "+1555000030"+strconv.Itoa(i), "+1555000040"+strconv.Itoa(i)
		cases = append(cases,
			kase{m: msg{p, stop, "STOP"}, code: 200, result: "suppressed"},
			kase{m: msg{p, stop, " stop "}, code: 200, result: "unchanged"},
			kase{m: msg{p, lift, "Unsubscribe"}, code: 200, result: "suppressed"},
			kase{m: msg{p, lift, "start"}, code: 200, result: "lifted"},
			kase{m: msg{p, help, "HELP"}, code: 200, result: "ignored"},
			kase{m: msg{p, help, "Please stop texting me"}, code: 200, result: "ignored"},
			kase{m: msg{p, forged, "STOP"}, forge: "key", code: 401},
			kase{m: msg{p, forged, "STOP"}, forge: "stale", code: 401},
			kase{m: msg{p, forged, "STOP"}, forge: "altered", code: 401},
		)
	}
	// The signers run once per provider, before the receiver starts (the
	// Telnyx signer makes the account's key pair).
	signed := make([]http.Header, len(cases))
	var vonageCases []vonageCase
	var sinchCases []sinchCase
	var telnyxCases []telnyxCase
	var twilioCases []nodetools.TwilioCase
	var idx = map[string][]int{}
	stale := now.Add(-10 * time.Minute).Unix()
	for i, c := range cases {
		b := string(body(c.m))
		if c.forge == "altered" {
			b = strings.Replace(b, "STOP", "HELP", 1) // signed a HELP, posts a STOP
		}
		idx[c.m.provider] = append(idx[c.m.provider], i)
		switch c.m.provider {
		case "generic":
			key, at := secret, now
			switch c.forge {
			case "key":
				key = []byte("another-secret-of-32-bytes-long!")
			case "stale":
				at = time.Unix(stale, 0)
			}
			signed[i] = http.Header{receiver.HeaderSignature: {receiver.SignGeneric(key, []byte(b), at)}}
		case "twilio":
			token, params := twilioToken, twilioForm(c.m)
			switch c.forge {
			case "key", "stale": // Twilio's signature has no time: another token for both
				token = "not-the-twilio-token"
			case "altered":
				params.Set("Body", "HELP")
			}
			twilioCases = append(twilioCases, nodetools.TwilioCase{Op: "sign", Token: token, URL: public + "/v1/inbound/twilio", Params: params})
		case "vonage":
			vc := vonageCase{Body: b}
			switch c.forge {
			case "key":
				vc.SignWith = "another-vonage-secret-0123456789"
			case "stale":
				vc.IAT = stale
			}
			vonageCases = append(vonageCases, vc)
		case "sinch":
			sc := sinchCase{Body: b}
			switch c.forge {
			case "key":
				sc.SignWith = "another-sinch-secret-0123456789"
			case "stale":
				sc.Timestamp = strconv.FormatInt(stale, 10)
			}
			sinchCases = append(sinchCases, sc)
		case "telnyx":
			tc := telnyxCase{Body: b}
			switch c.forge {
			case "key":
				tc.OtherKey = true
			case "stale":
				tc.Timestamp = stale
			}
			telnyxCases = append(telnyxCases, tc)
		}
	}
	for j, s := range nodetools.Twilio(t, twilioCases) {
		signed[idx["twilio"][j]] = http.Header{receiver.HeaderTwilioSignature: {s.Signature}}
	}
	for j, tok := range signVonage(t, vonageCases) {
		signed[idx["vonage"][j]] = http.Header{"Authorization": {"Bearer " + tok.Token}}
		// The SDK checks the token's signature (not its time, nor the
		// body's hash): only another secret's fails it.
		if want := cases[idx["vonage"][j]].forge != "key"; tok.SDKVerified != want {
			t.Errorf("vonage case %d: the SDK verifies it: %v", j, tok.SDKVerified)
		}
	}
	for j, s := range signSinch(t, sinchCases) {
		h := http.Header{}
		for k, v := range s.Headers {
			h.Set(k, v)
		}
		signed[idx["sinch"][j]] = h
	}
	var telnyxKey ed25519.PublicKey
	var telnyxSigned []telnyxSigned
	telnyxKey, telnyxSigned = signTelnyx(t, telnyxCases)
	for j, s := range telnyxSigned {
		signed[idx["telnyx"][j]] = http.Header{receiver.HeaderTelnyxSignature: {s.Signature}, receiver.HeaderTelnyxTimestamp: {s.Timestamp}}
	}

	f := start(t, func(c *receiver.Config) {
		c.PublicURL, c.VonageSecret, c.SinchSecret, c.TelnyxPublicKey, c.DefaultProvider = public, vonageSecret, sinchSecret, telnyxKey, "none"
	})
	for i, c := range cases {
		var code int
		var answer string
		if c.m.provider == "twilio" {
			form := twilioForm(c.m)
			code, answer = f.postInbound("twilio", "application/x-www-form-urlencoded", []byte(form.Encode()), signed[i])
			if code == 200 && !strings.Contains(answer, "<Response></Response>") {
				t.Errorf("twilio %q: answered %q, want an empty TwiML response", c.m.text, answer)
			}
		} else {
			code, answer = f.postInbound(c.m.provider, "application/json", body(c.m), signed[i])
		}
		if code != c.code || (c.result != "" && c.m.provider != "twilio" && !strings.Contains(answer, `"`+c.result+`"`)) {
			t.Errorf("%s %q (forged: %q): %d %s, want %d %s", c.m.provider, c.m.text, c.forge, code, answer, c.code, c.result)
		}
	}
	got := f.listed()
	for i, p := range []string{"generic", "twilio", "vonage", "sinch", "telnyx"} {
		stop := "+1555000010" + strconv.Itoa(i)
		if got[stop] != "inbound/"+p+"/STOP" {
			t.Errorf("%s: the STOP's number is listed as %q, want inbound/%s/STOP", p, got[stop], p)
		}
		delete(got, stop)
		for _, result := range []string{"suppressed", "unchanged", "lifted", "ignored"} {
			want := map[string]float64{"suppressed": 2, "unchanged": 1, "lifted": 1, "ignored": 2}[result]
			if n := f.inboundCount(p, result); n != want {
				t.Errorf("sendonce_inbound_total{source=%s,result=%s} = %v, want %v", p, result, n, want)
			}
		}
		if n := f.inboundCount(p, "forged") + f.inboundCount(p, "stale"); n != 3 {
			t.Errorf("%s: %v forged and stale inbound messages counted, want 3", p, n)
		}
	}
	for n, what := range got {
		t.Errorf("%s is listed (%s): only the STOPs' numbers are (a lifted, an ignored or a forged one is not)", n, what)
	}
}

// A receipt whose code says its provider refused the message because the
// recipient opted out puts the row's number on the list, in the receipts'
// transaction; another code does not.
func TestAnOptedOutReceiptSuppressesTheNumber(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *receiver.Config) { c.TwilioToken, c.DefaultProvider = "", "generic" })
	optedOut, other := f.row("sent"), uuid.New()
	if _, err := f.admin.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count)
		VALUES ($1, '+15557654321', 'Your code is 482901', 'sent', 1)`, other); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		body []byte
	}{
		{[]byte(`{"id":"msg_1","reference":"` + optedOut.String() + `","status":"undelivered","code":21610}`)},
		{[]byte(`{"id":"msg_2","reference":"` + other.String() + `","status":"undelivered","code":30003}`)},
	} {
		if code, result := f.post(tt.body, receiver.SignGeneric(secret, tt.body, time.Now())); code != 200 || result != "applied" {
			t.Errorf("receipt: %d %q", code, result)
		}
	}
	got := f.listed()
	if len(got) != 1 || got["+15551234567"] != "receipt/generic/code 21610" {
		t.Errorf("listed %v, want the opted-out row's number, from its receipt", got)
	}
}
