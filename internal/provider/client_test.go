package provider_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

// testMsg is the message every test sends. Its number and the digits of its
// body must never show up in an outcome.
var testMsg = provider.Message{
	Key:  "0b9c6a52-7f0e-4d5c-9a43-2b1f8f1e6a10",
	To:   "+15551234567",
	Body: "Your code is 482901",
}

// seenRequest is what a test provider received.
type seenRequest struct {
	Method, Path, Key, Auth, ContentType string
	Body                                 []byte
}

// fakeProvider is a real HTTP server on loopback that records each request
// and answers it with respond.
type fakeProvider struct {
	URL  string
	mu   sync.Mutex
	reqs []seenRequest
}

func startProvider(t *testing.T, respond http.HandlerFunc) *fakeProvider {
	t.Helper()
	p := &fakeProvider{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.reqs = append(p.reqs, seenRequest{
			Method: r.Method, Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key"),
			Auth: r.Header.Get("Authorization"), ContentType: r.Header.Get("Content-Type"), Body: body,
		})
		p.mu.Unlock()
		respond(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *fakeProvider) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.reqs...)
}

// reply answers with status, the headers given as name/value pairs, and body.
func reply(status int, body string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// newClient returns a client for base; mod adjusts the config.
func newClient(t *testing.T, base string, idempotent bool, mod func(*provider.Config)) *provider.Client {
	t.Helper()
	cfg := provider.Config{BaseURL: base, APIKey: "sk_test_secret", Idempotent: idempotent, Timeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	c, err := provider.New(cfg)
	if err != nil {
		t.Fatalf("provider.New: %v", err)
	}
	return c
}

func send(t *testing.T, c *provider.Client) provider.Outcome {
	t.Helper()
	return c.Send(context.Background(), testMsg)
}

// phoneLike matches six or more digits in a row, allowing the separators
// people write numbers with: "+15551234567", "(555) 123-4567", "555.123.4567".
var phoneLike = regexp.MustCompile(`[0-9](?:[ ().\-]{0,2}[0-9]){5,}`)

// assertNoSecrets fails if the outcome's text carries the number, the body's
// code or the API key, in any of the ways a provider might echo them.
func assertNoSecrets(t *testing.T, o provider.Outcome) {
	t.Helper()
	for _, s := range []string{o.Reason, o.Error()} {
		if m := phoneLike.FindString(s); m != "" {
			t.Errorf("outcome text %q holds a number-like run %q", s, m)
		}
		digits := strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, s)
		for _, secret := range []string{"5551234567", "1234567", "482901"} {
			if strings.Contains(digits, secret) {
				t.Errorf("outcome text %q holds the digits %s", s, secret)
			}
		}
		if strings.Contains(s, "sk_test_secret") {
			t.Errorf("outcome text %q holds the API key", s)
		}
	}
}

// both is the expected kind when the provider honours idempotency keys and
// when it does not.
type both struct{ idem, nonIdem provider.Kind }

func same(k provider.Kind) both { return both{k, k} }

var (
	retryOrAmbiguous = both{provider.Retry, provider.Ambiguous}
	modes            = []struct {
		name       string
		idempotent bool
	}{{"idempotent", true}, {"not_idempotent", false}}
)

func (b both) in(idempotent bool) provider.Kind {
	if idempotent {
		return b.idem
	}
	return b.nonIdem
}

func TestSendClassifiesResponses(t *testing.T) {
	t.Parallel()
	const maxAfter = 90 * time.Second
	huge := `{"id":"msg_big","pad":"` + strings.Repeat("x", provider.MaxResponseBytes) + `"}`
	hugeErr := `{"code":21211,"message":"` + strings.Repeat("x", provider.MaxResponseBytes) + `"}`
	// exactly builds a JSON object of n bytes holding fields, padded.
	exactly := func(n int, fields string) string {
		head := `{` + fields + `,"pad":"`
		return head + strings.Repeat("x", n-len(head)-2) + `"}`
	}
	limit := provider.MaxResponseBytes
	// soon is stamped when the response is written: a parallel subtest can
	// wait its turn for seconds on a loaded machine.
	soon := func(status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			reply(status, ``, "Retry-After", time.Now().Add(maxAfter/2).UTC().Format(http.TimeFormat))(w, r)
		}
	}
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	later := time.Now().Add(100 * maxAfter).UTC().Format(http.TimeFormat)

	tests := []struct {
		name      string
		respond   http.HandlerFunc
		permanent []int
		want      both
		status    int
		code      int
		ref       string
		// after bounds Outcome.After, inclusive; both zero means exactly 0.
		afterMin, afterMax time.Duration
		reason             string // a substring of Reason, when set
	}{
		// 2xx: the provider accepted, whatever its answer looks like.
		{name: "201 with id", respond: reply(201, `{"id":"msg_9f3a","to":"+15551234567","status":"queued"}`), want: same(provider.Sent), status: 201, ref: "msg_9f3a"},
		{name: "200 with id", respond: reply(200, `{"id":"msg_1"}`), want: same(provider.Sent), status: 200, ref: "msg_1"},
		{name: "202 empty body", respond: reply(202, ``), want: same(provider.Sent), status: 202},
		{name: "204 no content", respond: reply(204, ``), want: same(provider.Sent), status: 204},
		{name: "201 not JSON", respond: reply(201, `<html>queued</html>`), want: same(provider.Sent), status: 201},
		{name: "201 JSON without id", respond: reply(201, `{"status":"queued"}`), want: same(provider.Sent), status: 201},
		{name: "201 id not a string", respond: reply(201, `{"id":42}`), want: same(provider.Sent), status: 201},
		{name: "201 id too long", respond: reply(201, `{"id":"`+strings.Repeat("a", 201)+`"}`), want: same(provider.Sent), status: 201},
		{name: "201 oversized body", respond: reply(201, huge), want: same(provider.Sent), status: 201},
		{name: "201 at the size limit", respond: reply(201, exactly(limit, `"id":"msg_limit"`)), want: same(provider.Sent), status: 201, ref: "msg_limit"},
		{name: "201 one byte over the limit", respond: reply(201, exactly(limit+1, `"id":"msg_over"`)), want: same(provider.Sent), status: 201},
		{name: "201 truncated JSON", respond: reply(201, `{"id":"msg_`), want: same(provider.Sent), status: 201},
		{name: "201 with a permanent code", respond: reply(201, `{"id":"msg_2","code":21211}`), want: same(provider.Sent), status: 201, ref: "msg_2"},

		// Never retried.
		{name: "400", respond: reply(400, `{"code":123,"message":"missing body"}`), want: same(provider.Permanent), status: 400, code: 123, reason: "missing body"},
		{name: "400 empty body", respond: reply(400, ``), want: same(provider.Permanent), status: 400, reason: "Bad Request"},
		{name: "401", respond: reply(401, `{"message":"bad key"}`), want: same(provider.Permanent), status: 401, reason: "bad key"},
		{name: "403", respond: reply(403, `forbidden`), want: same(provider.Permanent), status: 403, reason: "Forbidden"},
		{name: "404", respond: reply(404, ``), want: same(provider.Permanent), status: 404},
		{name: "410", respond: reply(410, ``), want: same(provider.Permanent), status: 410},
		{name: "418", respond: reply(418, `{}`), want: same(provider.Permanent), status: 418},
		{name: "422", respond: reply(422, `{"code":42201,"message":"key reused with another body"}`), want: same(provider.Permanent), status: 422, code: 42201},
		{name: "400 oversized body", respond: reply(400, hugeErr), want: same(provider.Permanent), status: 400},
		{name: "300 is not followed", respond: reply(300, ``), want: same(provider.Permanent), status: 300},
		{name: "304 is not followed", respond: reply(304, ``), want: same(provider.Permanent), status: 304},

		// A permanent provider code is believed where the status says the
		// provider took nothing (a 4xx, a 429); where it may have taken the
		// message (408, 409, 425, any 5xx) the status's doubt wins.
		{name: "21214 on 429", respond: reply(429, `{"code":21214}`, "Retry-After", "5"), want: same(provider.Permanent), status: 429, code: 21214},
		{name: "21612 on 400", respond: reply(400, `{"code":21612}`), want: same(provider.Permanent), status: 400, code: 21612},
		{name: "21211 on 500", respond: reply(500, `{"code":21211,"message":"invalid To"}`), want: retryOrAmbiguous, status: 500, code: 21211},
		{name: "21614 on 503", respond: reply(503, `{"code":21614}`), want: retryOrAmbiguous, status: 503, code: 21614},
		{name: "21610 on 502", respond: reply(502, `{"code":21610}`), want: retryOrAmbiguous, status: 502, code: 21610},
		{name: "21211 on 504", respond: reply(504, `{"code":21211}`), want: retryOrAmbiguous, status: 504, code: 21211},
		{name: "21612 on 408", respond: reply(408, `{"code":21612}`), want: retryOrAmbiguous, status: 408, code: 21612},
		{name: "21211 on 409", respond: reply(409, `{"code":21211}`), want: retryOrAmbiguous, status: 409, code: 21211},
		{name: "21211 on 425", respond: reply(425, `{"code":21211}`), want: retryOrAmbiguous, status: 425, code: 21211},
		{name: "code as a JSON string", respond: reply(429, `{"code":"21610"}`), want: same(provider.Permanent), status: 429, code: 21610},
		{name: "extra permanent code", respond: reply(429, `{"code":30003}`), permanent: []int{30003}, want: same(provider.Permanent), status: 429, code: 30003},
		{name: "extra permanent code on 500", respond: reply(500, `{"code":30003}`), permanent: []int{30003}, want: retryOrAmbiguous, status: 500, code: 30003},
		{name: "extra code not configured", respond: reply(429, `{"code":30003}`), want: same(provider.Retry), status: 429, code: 30003},
		{name: "permanent code in an oversized body is unread", respond: reply(429, hugeErr), want: same(provider.Retry), status: 429},
		{name: "permanent code at the size limit", respond: reply(429, exactly(limit, `"code":21211`)), want: same(provider.Permanent), status: 429, code: 21211},
		{name: "permanent code one byte over the limit", respond: reply(429, exactly(limit+1, `"code":21211`)), want: same(provider.Retry), status: 429},
		{name: "negative code", respond: reply(429, `{"code":-21211}`), want: same(provider.Retry), status: 429},
		{name: "fractional code", respond: reply(429, `{"code":21211.5}`), want: same(provider.Retry), status: 429},
		{name: "code too large", respond: reply(429, `{"code":99999999999999999999}`), want: same(provider.Retry), status: 429},
		{name: "code not a number", respond: reply(500, `{"code":"abc","message":"x"}`), want: retryOrAmbiguous, status: 500, reason: "Internal Server Error"},

		// The request may have been taken (a gateway's 408 or 425 after
		// forwarding, the key in flight): safe to retry where the provider
		// honours the key, ambiguous elsewhere; maybe taken everywhere.
		{name: "408", respond: reply(408, ``), want: retryOrAmbiguous, status: 408},
		{name: "409 key in flight", respond: reply(409, `{"message":"in flight"}`), want: retryOrAmbiguous, status: 409},
		{name: "425", respond: reply(425, ``), want: retryOrAmbiguous, status: 425},
		{name: "429", respond: reply(429, `{"code":20429,"message":"slow down"}`), want: same(provider.Retry), status: 429, code: 20429},

		// 5xx: the provider may have acted.
		{name: "500", respond: reply(500, `{"message":"oops"}`), want: retryOrAmbiguous, status: 500},
		{name: "501", respond: reply(501, ``), want: retryOrAmbiguous, status: 501},
		{name: "502", respond: reply(502, `<html>bad gateway</html>`), want: retryOrAmbiguous, status: 502},
		{name: "503", respond: reply(503, ``), want: retryOrAmbiguous, status: 503},
		{name: "504", respond: reply(504, `null`), want: retryOrAmbiguous, status: 504},
		{name: "599", respond: reply(599, `[]`), want: retryOrAmbiguous, status: 599},
		{name: "500 malformed JSON", respond: reply(500, `{"code":`), want: retryOrAmbiguous, status: 500, reason: "Internal Server Error"},
		{name: "500 JSON string", respond: reply(500, `"x"`), want: retryOrAmbiguous, status: 500},
		{name: "500 Retry-After is ignored", respond: reply(500, ``, "Retry-After", "7"), want: retryOrAmbiguous, status: 500},

		// Retry-After on 429 and 503.
		{name: "429 Retry-After seconds", respond: reply(429, ``, "Retry-After", "7"), want: same(provider.Retry), status: 429, afterMin: 7 * time.Second, afterMax: 7 * time.Second},
		{name: "429 Retry-After padded", respond: reply(429, ``, "Retry-After", " 7 "), want: same(provider.Retry), status: 429, afterMin: 7 * time.Second, afterMax: 7 * time.Second},
		{name: "429 Retry-After zero", respond: reply(429, ``, "Retry-After", "0"), want: same(provider.Retry), status: 429, afterMin: time.Millisecond, afterMax: time.Millisecond},
		{name: "429 Retry-After date", respond: soon(429), want: same(provider.Retry), status: 429, afterMin: maxAfter/2 - 5*time.Second, afterMax: maxAfter / 2},
		{name: "429 Retry-After past date", respond: reply(429, ``, "Retry-After", past), want: same(provider.Retry), status: 429, afterMin: time.Millisecond, afterMax: time.Millisecond},
		{name: "429 Retry-After far date", respond: reply(429, ``, "Retry-After", later), want: same(provider.Retry), status: 429, afterMin: maxAfter, afterMax: maxAfter},
		{name: "429 Retry-After huge", respond: reply(429, ``, "Retry-After", "99999999999999999999"), want: same(provider.Retry), status: 429, afterMin: maxAfter, afterMax: maxAfter},
		{name: "429 Retry-After above the cap", respond: reply(429, ``, "Retry-After", "3600"), want: same(provider.Retry), status: 429, afterMin: maxAfter, afterMax: maxAfter},
		{name: "429 Retry-After garbage", respond: reply(429, ``, "Retry-After", "soon"), want: same(provider.Retry), status: 429},
		{name: "429 Retry-After negative", respond: reply(429, ``, "Retry-After", "-5"), want: same(provider.Retry), status: 429},
		{name: "429 Retry-After fraction", respond: reply(429, ``, "Retry-After", "1.5"), want: same(provider.Retry), status: 429},
		{name: "503 Retry-After seconds", respond: reply(503, ``, "Retry-After", "7"), want: retryOrAmbiguous, status: 503, afterMin: 7 * time.Second, afterMax: 7 * time.Second},
		{name: "503 Retry-After date", respond: soon(503), want: retryOrAmbiguous, status: 503, afterMin: maxAfter/2 - 5*time.Second, afterMax: maxAfter / 2},
	}
	for _, tt := range tests {
		for _, mode := range modes {
			t.Run(tt.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				p := startProvider(t, tt.respond)
				c := newClient(t, p.URL, mode.idempotent, func(cfg *provider.Config) {
					cfg.PermanentCodes = tt.permanent
					cfg.MaxRetryAfter = maxAfter
				})
				o := send(t, c)

				if want := tt.want.in(mode.idempotent); o.Kind != want {
					t.Fatalf("Kind = %v, want %v (outcome %+v)", o.Kind, want, o)
				}
				if o.HTTPStatus != tt.status {
					t.Errorf("HTTPStatus = %d, want %d", o.HTTPStatus, tt.status)
				}
				if o.Code != tt.code {
					t.Errorf("Code = %d, want %d", o.Code, tt.code)
				}
				if o.Ref != tt.ref {
					t.Errorf("Ref = %q, want %q", o.Ref, tt.ref)
				}
				// Retry-After only means something on a retry.
				afterMin, afterMax := tt.afterMin, tt.afterMax
				if o.Kind != provider.Retry {
					afterMin, afterMax = 0, 0
				}
				if o.After < afterMin || o.After > afterMax {
					t.Errorf("After = %s, want within [%s, %s]", o.After, afterMin, afterMax)
				}
				if tt.reason != "" && !strings.Contains(o.Reason, tt.reason) {
					t.Errorf("Reason = %q, want it to contain %q", o.Reason, tt.reason)
				}
				// A 5xx other than 503, a 409 (the key is in flight), a 408
				// or a 425 (a gateway's, after forwarding) leaves open that
				// the provider took a message it answered with an error,
				// whether or not it honours keys.
				maybe := tt.status >= 500 && tt.status != 503 || tt.status == 408 || tt.status == 409 || tt.status == 425
				if want := o.Kind != provider.Sent && o.Kind != provider.Permanent && maybe; o.MaybeAccepted != want {
					t.Errorf("MaybeAccepted = %v, want %v", o.MaybeAccepted, want)
				}
				if o.Kind != provider.Sent && o.Reason == "" {
					t.Error("a failed attempt has an empty Reason")
				}
				if o.Latency <= 0 {
					t.Errorf("Latency = %s, want > 0", o.Latency)
				}
				if n := len(p.requests()); n != 1 {
					t.Errorf("provider got %d requests, want 1", n)
				}
				assertNoSecrets(t, o)
			})
		}
	}
}

func TestSendRequestShape(t *testing.T) {
	t.Parallel()
	msg := provider.Message{Key: testMsg.Key, To: testMsg.To, Body: "Say \"hi\" <b>&</b> ünï\ncode\t482901"}
	tests := []struct {
		name, suffix, path, apiKey, auth string
	}{
		{name: "bare base", suffix: "", path: "/v1/messages", apiKey: "sk_live_1", auth: "Bearer sk_live_1"},
		{name: "trailing slash", suffix: "/", path: "/v1/messages", apiKey: "sk_live_1", auth: "Bearer sk_live_1"},
		{name: "path prefix", suffix: "/api", path: "/api/v1/messages", apiKey: "k", auth: "Bearer k"},
		{name: "path prefix and slashes", suffix: "/api//", path: "/api/v1/messages", apiKey: "k", auth: "Bearer k"},
		{name: "no API key", suffix: "", path: "/v1/messages", apiKey: "", auth: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startProvider(t, reply(201, `{"id":"msg_1"}`))
			c := newClient(t, p.URL+tt.suffix, true, func(cfg *provider.Config) { cfg.APIKey = tt.apiKey })
			// Two attempts of one message carry the same key.
			for range 2 {
				if o := c.Send(context.Background(), msg); o.Kind != provider.Sent {
					t.Fatalf("Send: %+v", o)
				}
			}
			reqs := p.requests()
			if len(reqs) != 2 {
				t.Fatalf("provider got %d requests, want 2", len(reqs))
			}
			for _, r := range reqs {
				if r.Method != http.MethodPost || r.Path != tt.path {
					t.Errorf("request %s %s, want POST %s", r.Method, r.Path, tt.path)
				}
				if r.Key != msg.Key {
					t.Errorf("Idempotency-Key = %q, want %q", r.Key, msg.Key)
				}
				if r.Auth != tt.auth {
					t.Errorf("Authorization = %q, want %q", r.Auth, tt.auth)
				}
				if r.ContentType != "application/json" {
					t.Errorf("Content-Type = %q, want application/json", r.ContentType)
				}
				var got map[string]any
				if err := json.Unmarshal(r.Body, &got); err != nil {
					t.Fatalf("body %q is not JSON: %v", r.Body, err)
				}
				// The reference is the row id, like the key: receipts and
				// lookups find the row by it.
				want := map[string]any{"to": msg.To, "body": msg.Body, "reference": msg.Key}
				if len(got) != len(want) || got["to"] != want["to"] || got["body"] != want["body"] || got["reference"] != want["reference"] {
					t.Errorf("body = %v, want exactly %v", got, want)
				}
			}
		})
	}
}

func TestSendNeverFollowsRedirects(t *testing.T) {
	t.Parallel()
	for _, status := range []int{301, 302, 303, 307, 308} {
		for _, mode := range modes {
			t.Run(fmt.Sprintf("%d/%s", status, mode.name), func(t *testing.T) {
				t.Parallel()
				target := startProvider(t, reply(201, `{"id":"msg_elsewhere"}`))
				p := startProvider(t, reply(status, ``, "Location", target.URL+"/v1/messages"))
				o := send(t, newClient(t, p.URL, mode.idempotent, nil))
				if o.Kind != provider.Permanent || o.HTTPStatus != status {
					t.Errorf("outcome %+v, want Permanent with HTTPStatus %d", o, status)
				}
				if n := len(target.requests()); n != 0 {
					t.Errorf("redirect target got %d requests, want 0", n)
				}
				if n := len(p.requests()); n != 1 {
					t.Errorf("provider got %d requests, want 1", n)
				}
			})
		}
	}
}

func TestOutcomeNeverEchoesTheNumber(t *testing.T) {
	t.Parallel()
	echoes := []string{
		"The 'To' number +15551234567 is not valid",
		"The 'To' number 15551234567 is not valid",
		"To +1 555 123 4567 is unreachable",
		"To +1 (555) 123-4567 is unreachable",
		"To (555) 123-4567 is unreachable",
		"To 555-123-4567 is unreachable",
		"To 555.123.4567 is unreachable",
		"To +1-555-123-4567 is unreachable",
		"body 'Your code is 482901' rejected",
		"to=+15551234567&body=Your+code+is+482901",
		"+15551234567",
		strings.Repeat("é", 95) + " +15551234567",
		strings.Repeat("x", 195) + "+15551234567",
	}
	for i, echo := range echoes {
		for _, status := range []int{400, 429, 500} {
			t.Run(fmt.Sprintf("%d/%d", i, status), func(t *testing.T) {
				t.Parallel()
				body, _ := json.Marshal(map[string]any{"code": 21211, "message": echo})
				if status != 400 {
					body, _ = json.Marshal(map[string]any{"message": echo})
				}
				p := startProvider(t, reply(status, string(body)))
				o := send(t, newClient(t, p.URL, true, nil))
				if o.Kind == provider.Sent {
					t.Fatalf("outcome %+v", o)
				}
				assertNoSecrets(t, o)
				if len(o.Reason) > 200 {
					t.Errorf("Reason is %d bytes, want at most 200", len(o.Reason))
				}
			})
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  provider.Config
		want string // substring of the error; "" means valid
	}{
		{name: "valid", cfg: provider.Config{BaseURL: "https://api.example.com"}},
		{name: "valid with path", cfg: provider.Config{BaseURL: "http://127.0.0.1:8080/sms/"}},
		{name: "missing BaseURL", cfg: provider.Config{}, want: "BaseURL"},
		{name: "relative BaseURL", cfg: provider.Config{BaseURL: "/v1"}, want: "BaseURL"},
		{name: "host without scheme", cfg: provider.Config{BaseURL: "api.example.com"}, want: "BaseURL"},
		{name: "host:port without scheme", cfg: provider.Config{BaseURL: "localhost:8080"}, want: "BaseURL"},
		{name: "ftp scheme", cfg: provider.Config{BaseURL: "ftp://api.example.com"}, want: "BaseURL"},
		{name: "no host", cfg: provider.Config{BaseURL: "http://"}, want: "BaseURL"},
		{name: "unparsable", cfg: provider.Config{BaseURL: "http://[::1"}, want: "BaseURL"},
		{name: "negative timeout", cfg: provider.Config{BaseURL: "http://x", Timeout: -time.Second}, want: "timeout"},
		{name: "negative connect timeout", cfg: provider.Config{BaseURL: "http://x", ConnectTimeout: -time.Second}, want: "timeout"},
		{name: "negative MaxConns", cfg: provider.Config{BaseURL: "http://x", MaxConns: -1}, want: "MaxConns"},
		{name: "negative MaxRetryAfter", cfg: provider.Config{BaseURL: "http://x", MaxRetryAfter: -time.Second}, want: "MaxRetryAfter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := provider.New(tt.cfg)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want == "" && c == nil:
				t.Fatal("New returned a nil client and no error")
			case tt.want != "" && err == nil:
				t.Fatalf("New accepted %+v", tt.cfg)
			case tt.want != "" && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tt.want)):
				t.Errorf("error %q does not name %s", err, tt.want)
			}
		})
	}
}

func TestClientAccessors(t *testing.T) {
	t.Parallel()
	c := newClient(t, "http://127.0.0.1:1", true, func(cfg *provider.Config) { cfg.Timeout = 3 * time.Second })
	if !c.Idempotent() || c.Timeout() != 3*time.Second {
		t.Errorf("Idempotent() = %v, Timeout() = %s; want true, 3s", c.Idempotent(), c.Timeout())
	}
	c = newClient(t, "http://127.0.0.1:1", false, func(cfg *provider.Config) { cfg.Timeout = 0 })
	if c.Idempotent() || c.Timeout() != 10*time.Second {
		t.Errorf("Idempotent() = %v, Timeout() = %s; want false and the 10s default", c.Idempotent(), c.Timeout())
	}
}

func TestOutcomeText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		o    provider.Outcome
		want string
	}{
		{provider.Outcome{HTTPStatus: 400, Code: 21211, Reason: "invalid To"}, "http 400, provider code 21211: invalid To"},
		{provider.Outcome{HTTPStatus: 503, Reason: "Service Unavailable"}, "http 503: Service Unavailable"},
		{provider.Outcome{Reason: "request not sent: connect failed"}, "request not sent: connect failed"},
	}
	for _, tt := range tests {
		if got := tt.o.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	kinds := map[provider.Kind]string{
		provider.Sent: "sent", provider.Retry: "retry", provider.Permanent: "permanent",
		provider.Ambiguous: "ambiguous", provider.Expired: "expired", 0: "kind(0)", 99: "kind(99)",
	}
	for k, want := range kinds {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

// rawServer is a TCP server on loopback that misbehaves on purpose: handle
// owns each accepted connection (numbered from 1) and may answer anything,
// or nothing.
type rawServer struct {
	URL  string
	mu   sync.Mutex
	reqs []rawRequest
}

type rawRequest struct {
	conn int
	key  string
	body string
}

func startRaw(t *testing.T, handle func(s *rawServer, c net.Conn, conn int)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{URL: "http://" + ln.Addr().String()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(s, c, n)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

// readRequest reads one whole request from the connection and records it.
func (s *rawServer) readRequest(br *bufio.Reader, conn int) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return false
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, rawRequest{conn: conn, key: req.Header.Get("Idempotency-Key"), body: string(body)})
	s.mu.Unlock()
	return true
}

func (s *rawServer) requests() []rawRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]rawRequest(nil), s.reqs...)
}

func TestSendTransportFailures(t *testing.T) {
	t.Parallel()
	// waitForClient blocks until the client gives up and closes.
	waitForClient := func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }
	tests := []struct {
		name   string
		handle func(s *rawServer, c net.Conn, br *bufio.Reader, conn int)
		// hang marks a server that never finishes its answer: the client's
		// timeout ends the attempt.
		hang   bool
		status int
	}{
		{name: "closed before any answer", handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
		}},
		{name: "reset before any answer", handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_ = c.(*net.TCPConn).SetLinger(0)
		}},
		{name: "closed mid status line", handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 20")
		}},
		{name: "closed mid headers", handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Type: appl")
		}},
		{name: "reset mid headers", handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Type: appl")
			_ = c.(*net.TCPConn).SetLinger(0)
		}},
		{name: "not HTTP", handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "220 smtp.example.com ESMTP +15551234567\r\n\r\n")
		}},
		{name: "500 closed mid body", status: 500, handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"code\":")
		}},
		{name: "201 closed mid body", status: 201, handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":\"msg_")
		}},
		{name: "201 chunked body cut", status: 201, handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"id\"\r\n")
		}},
		// Headers past MaxResponseHeaderBytes fail the attempt instead of
		// being read up to Go's 10 MiB default.
		{name: "headers beyond the limit", handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nX-Pad: "+strings.Repeat("a", provider.MaxResponseHeaderBytes)+"\r\n"+
				"X-Pad2: "+strings.Repeat("b", 1<<20)+"\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"id\":\"m1\"}")
		}},
		{name: "no answer within the timeout", hang: true, handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			waitForClient(c)
		}},
		{name: "headers then a stalled body", hang: true, status: 201, handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"id\":")
			waitForClient(c)
		}},
		{name: "stalled mid headers", hang: true, handle: func(s *rawServer, c net.Conn, br *bufio.Reader, n int) {
			s.readRequest(br, n)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\n")
			waitForClient(c)
		}},
	}
	for _, tt := range tests {
		for _, mode := range modes {
			t.Run(tt.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				s := startRaw(t, func(s *rawServer, c net.Conn, n int) { tt.handle(s, c, bufio.NewReader(c), n) })
				timeout := 5 * time.Second
				if tt.hang {
					// Long enough for the server goroutine to read the
					// request and write its part on a loaded machine.
					timeout = 2 * time.Second
				}
				c := newClient(t, s.URL, mode.idempotent, func(cfg *provider.Config) { cfg.Timeout = timeout })
				o := send(t, c)
				want := retryOrAmbiguous.in(mode.idempotent)
				if tt.status/100 == 2 && !mode.idempotent {
					// The status line proves the provider accepted.
					want = provider.Sent
				}
				if o.Kind != want {
					t.Errorf("Kind = %v, want %v (outcome %+v)", o.Kind, want, o)
				}
				if o.HTTPStatus != tt.status {
					t.Errorf("HTTPStatus = %d, want %d", o.HTTPStatus, tt.status)
				}
				if strings.Contains(o.Reason, "not sent") {
					t.Errorf("Reason %q claims the request was not sent; the server read it", o.Reason)
				}
				if o.Kind != provider.Sent && !o.MaybeAccepted {
					t.Errorf("MaybeAccepted unset: the server read the request and its answer was lost (outcome %+v)", o)
				}
				if tt.hang && o.Latency < timeout {
					t.Errorf("Latency = %s, below the %s timeout that ended it", o.Latency, timeout)
				}
				// A fresh connection: the transport must not have replayed.
				for deadline := time.Now().Add(5 * time.Second); len(s.requests()) == 0 && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
				if n := len(s.requests()); n != 1 {
					t.Errorf("server got %d requests, want 1", n)
				}
				assertNoSecrets(t, o)
			})
		}
	}
}

// A request cut off on a live connection before its last byte was
// reported written (here: the server reads the start of the request, then
// resets the connection while the client still writes a body larger than
// the sockets' buffers) may have been read whole by the provider for all
// the client can tell: it is never "not sent", at a provider that honours
// keys too, where "not sent" would let the row move to another provider of
// the list.
func TestSendCutOffMidRequestMayBeTaken(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			s := startRaw(t, func(s *rawServer, c net.Conn, n int) {
				_, _ = io.CopyN(io.Discard, c, 64<<10)
				_ = c.(*net.TCPConn).SetLinger(0) // the close resets
			})
			// Long enough for the client to encode the body and connect on
			// a loaded machine (with -race): the reset ends the attempt.
			c := newClient(t, s.URL, mode.idempotent, func(cfg *provider.Config) { cfg.Timeout = 30 * time.Second })
			// A body larger than the sockets' buffers: the client is still
			// writing when the reset comes.
			m := testMsg
			m.Body = strings.Repeat("x", 16<<20)
			o := c.Send(context.Background(), m)
			if o.Kind == provider.Sent || !o.MaybeAccepted || strings.Contains(o.Reason, "not sent") {
				t.Errorf("outcome %+v; want retry or ambiguous, maybe taken", o)
			}
		})
	}
}

// TestSendDropOnReusedConnection covers the keep-alive case: the provider
// reads a request on a reused connection, may act on it, and drops the
// connection before answering. net/http replays a POST carrying an
// Idempotency-Key on its own in that case, which is a second delivery at a
// provider that ignores the key.
func TestSendDropOnReusedConnection(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			var total atomic.Int32
			s := startRaw(t, func(s *rawServer, c net.Conn, conn int) {
				br := bufio.NewReader(c)
				for s.readRequest(br, conn) {
					n := total.Add(1)
					if n == 2 {
						return // read, maybe acted on, never answered
					}
					body := fmt.Sprintf(`{"id":"msg_%d"}`, n)
					if _, err := fmt.Fprintf(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
						return
					}
				}
			})
			c := newClient(t, s.URL, mode.idempotent, nil)
			first := provider.Message{Key: "first", To: testMsg.To, Body: "one"}
			if o := c.Send(context.Background(), first); o.Kind != provider.Sent || o.Ref != "msg_1" {
				t.Fatalf("first send: %+v", o)
			}
			o := c.Send(context.Background(), testMsg)
			reqs := s.requests()
			if len(reqs) < 2 || reqs[1].conn != reqs[0].conn {
				t.Fatalf("the second request did not reuse the first connection: %+v", reqs)
			}
			for _, r := range reqs[1:] {
				if r.key != testMsg.Key {
					t.Errorf("request carried key %q, want %q", r.key, testMsg.Key)
				}
			}
			if mode.idempotent {
				// A replay under the same key is safe, and net/http makes it.
				if o.Kind != provider.Sent && o.Kind != provider.Retry {
					t.Errorf("Kind = %v, want sent (replayed) or retry", o.Kind)
				}
				return
			}
			if o.Kind != provider.Ambiguous {
				t.Errorf("Kind = %v, want ambiguous (outcome %+v)", o.Kind, o)
			}
			if len(reqs) != 2 {
				t.Errorf("the provider that ignores keys got the message %d times, want once", len(reqs)-1)
			}
		})
	}
}

func TestSendNothingSent(t *testing.T) {
	t.Parallel()
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + ln.Addr().String()
		ln.Close()
		for _, mode := range modes {
			o := send(t, newClient(t, base, mode.idempotent, nil))
			if o.Kind != provider.Retry || o.HTTPStatus != 0 || !strings.Contains(o.Reason, "not sent") || o.MaybeAccepted {
				t.Errorf("%s: outcome %+v, want Retry, no status, \"not sent\", not MaybeAccepted", mode.name, o)
			}
		}
	})
	t.Run("context already canceled", func(t *testing.T) {
		t.Parallel()
		p := startProvider(t, reply(201, `{"id":"msg_1"}`))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for _, mode := range modes {
			o := newClient(t, p.URL, mode.idempotent, nil).Send(ctx, testMsg)
			if o.Kind != provider.Retry || !strings.Contains(o.Reason, "not sent") {
				t.Errorf("%s: outcome %+v, want Retry and \"not sent\"", mode.name, o)
			}
		}
		if n := len(p.requests()); n != 0 {
			t.Errorf("provider got %d requests, want 0", n)
		}
	})
}

// With a receipts URL every request asks for receipts there, the same on
// every attempt (the body of one key never changes).
func TestSendAsksForReceipts(t *testing.T) {
	t.Parallel()
	p := startProvider(t, reply(201, `{"id":"msg_1"}`))
	c := newClient(t, p.URL, true, func(cfg *provider.Config) { cfg.ReceiptsURL = "https://hooks.example.com/sendonce/" })
	for range 2 {
		if o := c.Send(context.Background(), testMsg); o.Kind != provider.Sent {
			t.Fatalf("Send: %+v", o)
		}
	}
	reqs := p.requests()
	if len(reqs) != 2 || string(reqs[0].Body) != string(reqs[1].Body) {
		t.Fatalf("requests %d; the two bodies differ", len(reqs))
	}
	var got map[string]any
	if err := json.Unmarshal(reqs[0].Body, &got); err != nil {
		t.Fatal(err)
	}
	if got["callback_url"] != "https://hooks.example.com/sendonce/v1/receipts/generic" || got["reference"] != testMsg.Key {
		t.Fatalf("body = %v", got)
	}
}

// A lookup reads the provider's messages for the reference: none, one with
// its status, several; an error is an error, not an empty answer.
func TestGenericLookup(t *testing.T) {
	t.Parallel()
	ref := testMsg.Key
	tests := []struct {
		name   string
		status int
		body   string
		want   []provider.Found
		err    bool
	}{
		{"none", 200, `{"messages":[]}`, nil, false},
		{"one delivered", 200, `{"messages":[{"id":"msg_1","reference":"` + ref + `","status":"delivered"}]}`, []provider.Found{{Ref: "msg_1", Status: "delivered"}}, false},
		{"one queued", 200, `{"messages":[{"id":"msg_1","reference":"` + ref + `","status":"queued"}]}`, []provider.Found{{Ref: "msg_1", Status: "accepted"}}, false},
		{"two", 200, `{"messages":[{"id":"msg_1","reference":"` + ref + `","status":"failed"},{"id":"msg_2","reference":"` + ref + `","status":"sent"}]}`,
			[]provider.Found{{Ref: "msg_1", Status: "undelivered"}, {Ref: "msg_2", Status: "accepted"}}, false},
		{"another reference ignored", 200, `{"messages":[{"id":"msg_9","reference":"other","status":"delivered"}]}`, nil, false},
		{"server error", 503, `{}`, nil, true},
		{"not json", 200, `<html>`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startProvider(t, reply(tt.status, tt.body))
			c := newClient(t, p.URL, false, func(cfg *provider.Config) { cfg.Lookup = true; cfg.APIKey = "k" })
			res := c.Lookup(context.Background(), provider.LookupQuery{Reference: ref})
			if (res.Err != nil) != tt.err || len(res.Found) != len(tt.want) {
				t.Fatalf("Lookup = %+v, want %v (error %v)", res, tt.want, tt.err)
			}
			for i := range tt.want {
				if res.Found[i] != tt.want[i] {
					t.Errorf("found[%d] = %+v, want %+v", i, res.Found[i], tt.want[i])
				}
			}
			reqs := p.requests()
			if len(reqs) != 1 || reqs[0].Method != http.MethodGet || reqs[0].Path != "/v1/messages" || reqs[0].Auth != "Bearer k" {
				t.Fatalf("lookup request %+v", reqs)
			}
		})
	}
}
