package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/breaker"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/outbox"
)

// The secrets of the consent tests' receiver, one per provider.
var (
	consentVonageSecret = "vonage-signature-secret-e2e-0123456789"
	consentSinchSecret  = "sinch-callback-secret-e2e-0123456789"
)

// consent is a two-provider pipeline (SMS_PROVIDERS twilio, then generic:
// the Twilio adapter against the env's stub's Twilio facade, the generic
// API against a second stub), every call recorded by its row's key, and a
// receiver that verifies every provider's inbound messages.
type consent struct {
	*env
	second  *smsstub.Server
	calls   calls
	twilio  sender.Route
	generic sender.Route
	addr    string // the receiver's listener, as a base URL
}

// consentPublic is the consent tests' receiver's public URL, as the
// providers call it (a Twilio signature covers it).
const consentPublic = "https://receiver.example.com"

// newConsent starts the stubs; the pipeline and the receiver are started
// by startPipeline and startReceiver.
func newConsent(t *testing.T) *consent {
	t.Helper()
	e := setup(t, envOptions{stub: smsstub.Config{IgnoreKeys: true, Twilio: testTwilio}})
	second, secondURL := e.startStub()
	c := &consent{env: e, second: second}
	// The Twilio route records its calls by the row id the adapter puts in
	// StatusCallback, as the stub keys them.
	tw, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: e.stubURL, AccountSID: testTwilio.AccountSID, AuthToken: testTwilio.AuthToken,
		From: "+15550001111", Timeout: 5 * time.Second, ReceiptsURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	gen, err := provider.New(provider.Config{BaseURL: secondURL, APIKey: testAPIKey, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	record := func(p *provider.Client) *hookProv {
		h := &hookProv{Client: p}
		h.send = func(ctx context.Context, m provider.Message) provider.Outcome {
			c.calls.record(m.Key)
			return p.Send(ctx, m)
		}
		return h
	}
	c.twilio = sender.Route{Name: "twilio", Provider: record(tw),
		Breaker: breaker.New(breaker.Config{Failures: 3, OpenFor: time.Hour, MaxOpenFor: time.Hour})}
	c.generic = sender.Route{Name: "generic", Provider: record(gen),
		Breaker: breaker.New(breaker.Config{Failures: 3, OpenFor: time.Hour, MaxOpenFor: time.Hour})}
	return c
}

// openTwilio opens the Twilio route's circuit (three failures in a row):
// new rows go to the generic API, as they would after an outage.
func (c *consent) openTwilio() {
	for range 3 {
		c.twilio.Breaker.Admit()
		c.twilio.Breaker.Done(false)
	}
	if c.twilio.Breaker.State() != breaker.Open {
		c.t.Fatal("the Twilio circuit did not open")
	}
}

// startPipeline runs a relay and a sender, the sender as the
// least-privilege sendonce_sender role.
func (c *consent) startPipeline() {
	c.t.Helper()
	_, stopRelay := c.startRelay(relay.Config{})
	stop := c.startSender(senderOptions{pool: newPool(c.t, pgtest.AsRole(c.t, c.url, "sendonce_sender")),
		cfg: sender.Config{Routes: []sender.Route{c.twilio, c.generic}, Lease: 10 * time.Second}})
	c.t.Cleanup(func() { stop(); stopRelay() })
}

// startConsentReceiver runs a receiver as sendonce_receiver that verifies
// the generic secret, Twilio's token (under consentPublic), Vonage's and
// Sinch's secrets and the Telnyx key pk (none when nil), on a real socket.
func (c *consent) startConsentReceiver(pk ed25519.PublicKey) {
	c.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	c.addr = "http://" + ln.Addr().String()
	pool := newPool(c.t, pgtest.AsRole(c.t, c.url, "sendonce_receiver"))
	rv, err := receiver.New(receiver.Config{Pool: pool, Secrets: [][]byte{testReceiptSecret}, TwilioToken: testTwilio.AuthToken,
		PublicURL: consentPublic, VonageSecret: []byte(consentVonageSecret), SinchSecret: []byte(consentSinchSecret),
		TelnyxPublicKey: pk, DefaultProvider: "none", Logger: c.logger()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.background("receiver", func(ctx context.Context) error { return rv.Serve(ctx, ln, 15*time.Second) })
}

// insertTo commits n rows to number, and returns their ids.
func (c *consent) insertTo(number string, n int) []uuid.UUID {
	c.t.Helper()
	var ids []uuid.UUID
	err := pgx.BeginFunc(context.Background(), c.pool, func(tx pgx.Tx) error {
		for i := range n {
			id, err := outbox.Enqueue(context.Background(), tx, number, fmt.Sprintf("Your code is %06d", 300000+i))
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return ids
}

// post posts body to the receiver's path with headers h; it returns the
// status.
func (c *consent) post(path, contentType string, body []byte, h http.Header) int {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.addr+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// keywords are signed inbound messages, one per provider: what each
// provider posts when a recipient replies, signed as it signs them, by
// its official SDK where one exists (Twilio's getExpectedTwilioSignature,
// Vonage's JWT as @vonage/jwt verifies it, Sinch's HMAC as
// @sinch/sdk-core verifies it, Telnyx's Ed25519 as telnyx's SDK verifies
// it), and by our own SignGeneric for the generic API, whose contract is
// ours.
type keyword struct {
	provider, from, text string
	path, contentType    string
	body                 []byte
	header               http.Header
}

// signKeywords signs each (provider, from, text); forged ones are signed
// with another secret or key. It returns them in order, and the Telnyx
// account key the receiver must verify them with.
func signKeywords(t *testing.T, msgs [][3]string, forged bool) ([]keyword, ed25519.PublicKey) {
	t.Helper()
	now := time.Now().UTC()
	out := make([]keyword, len(msgs))
	type vonageCase struct {
		Body     string `json:"body"`
		SignWith string `json:"sign_with,omitempty"`
	}
	type telnyxCase struct {
		Body     string `json:"body"`
		OtherKey bool   `json:"other_key,omitempty"`
	}
	var twilio []nodetools.TwilioCase
	var vonage []vonageCase
	var sinch []vonageCase
	var telnyx []telnyxCase
	var twIdx, voIdx, siIdx, teIdx []int
	for i, m := range msgs {
		p, from, text := m[0], m[1], m[2]
		k := keyword{provider: p, from: from, text: text, path: "/v1/inbound/" + p, contentType: "application/json"}
		var v any
		switch p {
		case "generic":
			v = map[string]string{"id": "in_" + uuid.NewString()[:8], "from": from, "to": "+15550001111", "text": text}
		case "vonage":
			v = map[string]any{"channel": "sms", "message_uuid": uuid.NewString(), "to": "15550001111",
				"from": strings.TrimPrefix(from, "+"), "timestamp": now.Format(time.RFC3339), "text": text}
		case "sinch":
			v = map[string]any{"type": "mo_text", "id": "01FC66621VHDBN119Z8PMV1QPA", "from": from, "to": "+15550001111",
				"body": text, "received_at": now.Format(time.RFC3339)}
		case "telnyx":
			v = map[string]any{"data": map[string]any{"event_type": "message.received", "id": uuid.NewString(),
				"occurred_at": now.Format(time.RFC3339), "record_type": "event",
				"payload": map[string]any{"direction": "inbound", "type": "SMS", "text": text,
					"from": map[string]any{"phone_number": from}, "to": []map[string]any{{"phone_number": "+15550001111"}}}}}
		case "twilio":
			k.contentType = "application/x-www-form-urlencoded"
			form := url.Values{"MessageSid": {"SM" + strings.ReplaceAll(uuid.NewString(), "-", "")}, "AccountSid": {testTwilio.AccountSID},
				"From": {from}, "To": {"+15550001111"}, "Body": {text}, "NumMedia": {"0"}, "SmsStatus": {"received"}}
			k.body = []byte(form.Encode())
			token := testTwilio.AuthToken
			if forged {
				token = "not-the-twilio-token"
			}
			twilio = append(twilio, nodetools.TwilioCase{Op: "sign", Token: token, URL: consentPublic + k.path, Params: form})
			twIdx = append(twIdx, i)
		}
		if v != nil {
			k.body, _ = json.Marshal(v)
		}
		switch p {
		case "generic":
			secret := testReceiptSecret
			if forged {
				secret = []byte("not-the-receipt-secret-0123456789")
			}
			k.header = http.Header{receiver.HeaderSignature: {receiver.SignGeneric(secret, k.body, time.Now())}}
		case "vonage":
			c := vonageCase{Body: string(k.body)}
			if forged {
				c.SignWith = "not-the-vonage-secret-0123456789"
			}
			vonage, voIdx = append(vonage, c), append(voIdx, i)
		case "sinch":
			c := vonageCase{Body: string(k.body)}
			if forged {
				c.SignWith = "not-the-sinch-secret-0123456789"
			}
			sinch, siIdx = append(sinch, c), append(siIdx, i)
		case "telnyx":
			telnyx, teIdx = append(telnyx, telnyxCase{Body: string(k.body), OtherKey: forged}), append(teIdx, i)
		}
		out[i] = k
	}
	if len(twilio) > 0 {
		for j, s := range nodetools.Twilio(t, twilio) {
			out[twIdx[j]].header = http.Header{receiver.HeaderTwilioSignature: {s.Signature}}
		}
	}
	if len(vonage) > 0 {
		in, _ := json.Marshal(vonage)
		var toks []struct {
			Token string `json:"token"`
		}
		if err := json.Unmarshal([]byte(nodetools.Node(t, "sign-vonage-webhook.js", in, []string{"VONAGE_SIGNATURE_SECRET=" + consentVonageSecret})), &toks); err != nil {
			t.Fatal(err)
		}
		for j, tok := range toks {
			out[voIdx[j]].header = http.Header{"Authorization": {"Bearer " + tok.Token}}
		}
	}
	if len(sinch) > 0 {
		in, _ := json.Marshal(sinch)
		var signed []struct {
			Headers map[string]string `json:"headers"`
		}
		if err := json.Unmarshal([]byte(nodetools.Node(t, "sign-sinch-callback.js", in, []string{"SINCH_CALLBACK_SECRET=" + consentSinchSecret})), &signed); err != nil {
			t.Fatal(err)
		}
		for j, s := range signed {
			h := http.Header{}
			for k, v := range s.Headers {
				h.Set(k, v)
			}
			out[siIdx[j]].header = h
		}
	}
	var pk ed25519.PublicKey
	if len(telnyx) > 0 {
		in, _ := json.Marshal(telnyx)
		var ans struct {
			PublicKey string `json:"public_key"`
			Webhooks  []struct {
				Signature string `json:"signature"`
				Timestamp string `json:"timestamp"`
			} `json:"webhooks"`
		}
		if err := json.Unmarshal([]byte(nodetools.Node(t, "sign-telnyx-webhook.js", in, nil)), &ans); err != nil {
			t.Fatal(err)
		}
		var err error
		if pk, err = receiver.ParseTelnyxPublicKey(ans.PublicKey); err != nil {
			t.Fatal(err)
		}
		for j, w := range ans.Webhooks {
			out[teIdx[j]].header = http.Header{receiver.HeaderTelnyxSignature: {w.Signature}, receiver.HeaderTelnyxTimestamp: {w.Timestamp}}
		}
	}
	return out, pk
}

// waitDone waits until every one of ids is terminal and returns the rows.
func (c *consent) waitDone(ids []uuid.UUID) map[uuid.UUID]row {
	c.t.Helper()
	return c.waitTerminal(ids, 60*time.Second)
}

// A recipient replies STOP to one provider, any of the five: the receiver
// takes the reply, signed as that provider signs it, and every later row
// to the number, through SMS_PROVIDERS with the first provider's circuit
// open (so rows go to the second), ends suppressed with no call at either
// provider; rows to other numbers are sent once each. A START lifts it:
// the next row is sent, once. The suppressed rows name their source.
func TestAStopAtAnyProviderReachesNoProvider(t *testing.T) {
	t.Parallel()
	c := newConsent(t)
	providers := []string{"generic", "twilio", "vonage", "sinch", "telnyx"}
	number := func(i int) string { return fmt.Sprintf("+1555200%04d", i) }
	var stops, starts [][3]string
	for i, p := range providers {
		stops = append(stops, [3]string{p, number(i), "STOP"})
		starts = append(starts, [3]string{p, number(i), "Start"})
	}
	// One signer run signs every message: its Telnyx key is the receiver's.
	msgs, pk := signKeywords(t, append(stops, starts...), false)
	c.startConsentReceiver(pk)
	for _, k := range msgs[:len(stops)] {
		if code := c.post(k.path, k.contentType, k.body, k.header); code != 200 {
			t.Fatalf("%s STOP: %d", k.provider, code)
		}
	}
	c.openTwilio()
	c.startPipeline()

	var stopped, others []uuid.UUID
	for i := range providers {
		stopped = append(stopped, c.insertTo(number(i), 4)...)
		others = append(others, c.insertTo(fmt.Sprintf("+1555300%04d", i), 2)...)
	}
	rows := c.waitDone(append(append([]uuid.UUID{}, stopped...), others...))
	for _, id := range stopped {
		r := rows[id]
		if r.status != outbox.StatusSuppressed || len(c.calls.of(id.String())) != 0 || !strings.Contains(r.lastErr, "(source inbound ") {
			t.Errorf("row %s to a number that replied STOP: %s, %d calls, %q; want suppressed, no call, its source named",
				id, r.status, len(c.calls.of(id.String())), r.lastErr)
		}
	}
	for _, id := range others {
		if r := rows[id]; r.status != outbox.StatusSent || len(c.calls.of(id.String())) != 1 {
			t.Errorf("row %s to another number: %s, %d calls; want sent once", id, r.status, len(c.calls.of(id.String())))
		}
	}
	if n := c.stub.Stats().Requests + c.second.Stats().Requests; n != int64(len(others)) {
		t.Errorf("the providers got %d requests, want %d (the other numbers' rows alone)", n, len(others))
	}

	// START at each provider lifts its number: the next row is sent once.
	for _, k := range msgs[len(stops):] {
		if code := c.post(k.path, k.contentType, k.body, k.header); code != 200 {
			t.Fatalf("%s START: %d", k.provider, code)
		}
	}
	var after []uuid.UUID
	for i := range providers {
		after = append(after, c.insertTo(number(i), 1)...)
	}
	rows = c.waitDone(after)
	for _, id := range after {
		if r := rows[id]; r.status != outbox.StatusSent || len(c.calls.of(id.String())) != 1 {
			t.Errorf("row %s after START: %s, %d calls; want sent once", id, r.status, len(c.calls.of(id.String())))
		}
	}
	c.checkNoNumbersLogged(append(stopped, after...))
}

// A STOP Twilio knew of and sendonce did not (Twilio's own keyword
// handling; its webhook never reached the receiver): the first row to the
// number goes to Twilio, which refuses it with 21610. The row ends
// suppressed, not dead, and the number goes on the list, from the refusal:
// the next row, routed to the second provider once Twilio's circuit is
// open, is not called.
func TestAnOptedOutRefusalSuppressesTheNumberEverywhere(t *testing.T) {
	t.Parallel()
	c := newConsent(t)
	const number = "+15552100001"
	c.stub.OptOut(number)
	c.startPipeline()
	first := c.insertTo(number, 1)
	rows := c.waitDone(first)
	if r := rows[first[0]]; r.status != outbox.StatusSuppressed || len(c.calls.of(first[0].String())) != 1 ||
		!strings.Contains(r.lastErr, "opted out") {
		t.Fatalf("the refused row: %s, %d calls, %q; want suppressed after its one call", r.status, len(c.calls.of(first[0].String())), r.lastErr)
	}
	var source, prov string
	if err := c.pool.QueryRow(context.Background(), `SELECT source, provider FROM sms_suppressions WHERE number = $1`, number).Scan(&source, &prov); err != nil ||
		source != "refusal" || prov != "twilio" {
		t.Fatalf("the number's entry: %q %q (%v); want refusal from twilio", source, prov, err)
	}
	c.openTwilio()
	next := append(c.insertTo(number, 3), c.insertTo("+15552100002", 1)...)
	rows = c.waitDone(next)
	for _, id := range next[:3] {
		if r := rows[id]; r.status != outbox.StatusSuppressed || len(c.calls.of(id.String())) != 0 || !strings.Contains(r.lastErr, "(source refusal twilio)") {
			t.Errorf("row %s after the refusal: %s, %d calls, %q; want suppressed, no call at either provider", id, r.status, len(c.calls.of(id.String())), r.lastErr)
		}
	}
	if r := rows[next[3]]; r.status != outbox.StatusSent || c.second.Deliveries()[next[3].String()].Deliveries != 1 {
		t.Errorf("a row to another number: %s; want sent once, by the second provider", r.status)
	}
	if d := c.second.Stats().Requests; d != 1 {
		t.Errorf("the second provider got %d requests, want 1", d)
	}
}

// A STOP signed with another provider's secret, or another account's key,
// or unsigned, is refused (401) and lists nothing: rows to the number are
// sent as before.
func TestAForgedStopSuppressesNothing(t *testing.T) {
	t.Parallel()
	c := newConsent(t)
	providers := []string{"generic", "twilio", "vonage", "sinch", "telnyx"}
	var stops [][3]string
	for i, p := range providers {
		stops = append(stops, [3]string{p, fmt.Sprintf("+1555400%04d", i), "STOP"})
	}
	// The genuine signer's key pair is the receiver's; the forged
	// webhooks are signed with another.
	_, pk := signKeywords(t, stops[4:], false)
	c.startConsentReceiver(pk)
	forged, _ := signKeywords(t, stops, true)
	for _, k := range forged {
		if code := c.post(k.path, k.contentType, k.body, k.header); code != http.StatusUnauthorized {
			t.Errorf("%s forged STOP: %d, want 401", k.provider, code)
		}
		if code := c.post(k.path, k.contentType, k.body, nil); code != http.StatusUnauthorized {
			t.Errorf("%s unsigned STOP: %d, want 401", k.provider, code)
		}
	}
	var n int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_suppressions`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d numbers listed after forged STOPs (%v), want 0", n, err)
	}
	c.startPipeline()
	var ids []uuid.UUID
	for _, s := range stops {
		ids = append(ids, c.insertTo(s[1], 1)...)
	}
	rows := c.waitDone(ids)
	for _, id := range ids {
		if r := rows[id]; r.status != outbox.StatusSent || len(c.calls.of(id.String())) != 1 {
			t.Errorf("row %s to a number a forged STOP named: %s, %d calls; want sent once", id, r.status, len(c.calls.of(id.String())))
		}
	}
}

// A STOP that races the senders' claims: rows to the number keep coming
// while it is sent. Each row is either called, once, having been claimed
// before the STOP committed, or suppressed with no call; never both, and
// no row claimed after the STOP committed is called.
func TestAStopRacingClaims(t *testing.T) {
	t.Parallel()
	c := newConsent(t)
	c.openTwilio()
	c.startPipeline()
	const number = "+15552500001"
	c.startConsentReceiver(nil)

	var (
		mu  sync.Mutex
		ids []uuid.UUID
	)
	stopInsert := make(chan struct{})
	inserted := make(chan struct{})
	go func() {
		defer close(inserted)
		for {
			select {
			case <-stopInsert:
				return
			default:
			}
			more := c.insertTo(number, 5)
			mu.Lock()
			ids = append(ids, more...)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	testkit.WaitFor(t, 30*time.Second, "rows to the number sent", func() bool {
		var sent int
		_ = c.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = 'sent'`).Scan(&sent)
		return sent >= 30
	})
	// The generic API's STOP, signed now (its signature has a time).
	msgs, _ := signKeywords(t, [][3]string{{"generic", number, "STOP"}}, false)
	if code := c.post(msgs[0].path, msgs[0].contentType, msgs[0].body, msgs[0].header); code != 200 {
		t.Fatalf("STOP: %d", code)
	}
	var committed time.Time
	if err := c.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&committed); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	close(stopInsert)
	<-inserted
	mu.Lock()
	all := append([]uuid.UUID(nil), ids...)
	mu.Unlock()
	rows := c.waitTerminal(all, 60*time.Second)
	claimed := map[uuid.UUID]time.Time{}
	cur, _ := c.pool.Query(context.Background(), `SELECT id, lease_until - interval '10 seconds' FROM sms_outbox WHERE status = 'sent'`)
	var id uuid.UUID
	var at time.Time
	if _, err := pgx.ForEachRow(cur, []any{&id, &at}, func() error { claimed[id] = at; return nil }); err != nil {
		t.Fatal(err)
	}
	var sent, suppressed int
	for _, id := range all {
		n := len(c.calls.of(id.String()))
		switch r := rows[id]; {
		case r.status == outbox.StatusSent && n == 1:
			sent++
			if !claimed[id].Before(committed) {
				t.Errorf("row %s was claimed at %s, after the STOP committed (%s), and called", id, claimed[id], committed)
			}
		case r.status == outbox.StatusSuppressed && n == 0:
			suppressed++
		default:
			t.Errorf("row %s: %s with %d calls; want sent once or suppressed uncalled", id, r.status, n)
		}
	}
	if sent == 0 || suppressed == 0 {
		t.Errorf("%d rows sent, %d suppressed: the STOP did not fall among the claims", sent, suppressed)
	}
	t.Logf("%d rows called before the STOP, %d suppressed after it", sent, suppressed)
}

// checkNoNumbersLogged fails if a row's number appears in the logs.
func (c *consent) checkNoNumbersLogged(ids []uuid.UUID) {
	c.t.Helper()
	logs := c.logs.all()
	rows, _ := c.pool.Query(context.Background(), `SELECT DISTINCT to_e164::text FROM sms_outbox WHERE id = ANY($1)`, ids)
	numbers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	for _, n := range numbers {
		if strings.Contains(logs, n) || strings.Contains(logs, strings.TrimPrefix(n, "+")) {
			c.t.Errorf("a number (%s) appears in the logs", outboxMask(n))
		}
	}
}

func outboxMask(n string) string { return n[:2] + strings.Repeat("*", len(n)-4) + n[len(n)-2:] }
