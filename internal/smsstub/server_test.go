package smsstub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/testing/testkit"
)

const (
	testTo   = "+15551234567"
	testText = "Your code is 482901"
)

var successBody = regexp.MustCompile(`^\{"id":"msg_[0-9a-f]{24}","to":"\+15551234567","status":"queued"\}\n$`)

func TestFirstRequestDelivers(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{})

	r := s.send(t, "k1", msg(testTo, testText))
	if r.status != http.StatusCreated {
		t.Fatalf("status %d, want 201; body %s", r.status, r.body)
	}
	if !successBody.Match(r.body) {
		t.Fatalf("body %q does not match %v", r.body, successBody)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if r.replayed() {
		t.Error("first response carries Idempotent-Replayed")
	}
	id := providerID(t, r)
	want := map[string]Delivery{"k1": {To: testTo, Deliveries: 1, Requests: 1, ProviderID: id}}
	if got := s.Deliveries(); !maps.Equal(got, want) {
		t.Errorf("Deliveries() = %+v, want %+v", got, want)
	}
	if got, want := s.Stats(), (Stats{Requests: 1, Deliveries: 1, Keys: 1}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

func TestReplayIsByteForByte(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{})
	body := msg(testTo, testText)

	first := s.send(t, "k1", body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: status %d; body %s", first.status, first.body)
	}
	for i := range 2 {
		again := s.send(t, "k1", body)
		if again.status != http.StatusCreated || string(again.body) != string(first.body) {
			t.Fatalf("replay %d: %d %q, want 201 %q", i, again.status, again.body, first.body)
		}
		if !again.replayed() {
			t.Fatalf("replay %d: missing Idempotent-Replayed: true", i)
		}
	}
	if got := s.Deliveries()["k1"]; got.Deliveries != 1 || got.Requests != 3 {
		t.Errorf("record %+v, want 1 delivery and 3 requests", got)
	}
	if got, want := s.Stats(), (Stats{Requests: 3, Deliveries: 1, Replays: 2, Keys: 1}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

func TestKeyReuseWithDifferentBody(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{})
	body := msg(testTo, testText)
	first := s.send(t, "k1", body)

	for _, tc := range []struct{ name, body string }{
		{"different text", msg(testTo, "Your code is 000000")},
		// The cache hashes raw bytes: equivalent JSON is still a different
		// request, so clients must resend the exact bytes.
		{"reformatted JSON", strings.Replace(body, ",", ", ", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, s.send(t, "k1", tc.body), http.StatusUnprocessableEntity, http.StatusUnprocessableEntity,
				"Idempotency-Key reused with a different request body")
		})
	}
	again := s.send(t, "k1", body)
	if !again.replayed() || string(again.body) != string(first.body) {
		t.Fatalf("original body after mismatches: %d %q, want replay of %q", again.status, again.body, first.body)
	}
	if got := s.Stats(); got.Mismatches != 2 || got.Deliveries != 1 {
		t.Errorf("Stats() = %+v, want 2 mismatches and 1 delivery", got)
	}
}

// TestConcurrentSameKey fires a burst of identical requests; latency keeps
// the first in flight while the rest arrive.
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{Latency: 100 * time.Millisecond}})
	body := msg(testTo, testText)
	const n = 16

	start := make(chan struct{})
	results := make([]result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			results[i], errs[i] = post(ctx, s.client, s.url, "same", body)
		})
	}
	close(start)
	wg.Wait()

	var originals, conflicts, replays int
	var original []byte
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		switch {
		case r.status == http.StatusCreated && !r.replayed():
			originals++
			original = r.body
		case r.status == http.StatusCreated:
			replays++
		case r.status == http.StatusConflict:
			wantError(t, r, http.StatusConflict, http.StatusConflict, "a request with this Idempotency-Key is in progress")
			conflicts++
		default:
			t.Fatalf("request %d: unexpected %d %s", i, r.status, r.body)
		}
	}
	if originals != 1 {
		t.Fatalf("%d original 201s, want exactly 1 (conflicts %d, replays %d)", originals, conflicts, replays)
	}
	for i, r := range results {
		if r.replayed() && string(r.body) != string(original) {
			t.Errorf("request %d replayed %q, want %q", i, r.body, original)
		}
	}
	if got := s.Deliveries()["same"]; got.Deliveries != 1 || got.Requests != n {
		t.Errorf("record %+v, want 1 delivery and %d requests", got, n)
	}
	if got := s.Stats(); got.Conflicts != int64(conflicts) || got.Replays != int64(replays) {
		t.Errorf("Stats() = %+v, want %d conflicts and %d replays", got, conflicts, replays)
	}
}

// TestInFlightKey holds a first request in its latency deterministically,
// checks what concurrent requests see, then lets the client give up.
func TestInFlightKey(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{Latency: time.Hour}})
	body := msg(testTo, testText)

	ctx, cancel := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() {
		_, err := post(ctx, s.client, s.url, "k1", body)
		firstErr <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "first request in flight", func() bool { return s.Stats().Requests == 1 })

	wantError(t, s.send(t, "k1", body), http.StatusConflict, http.StatusConflict,
		"a request with this Idempotency-Key is in progress")
	wantError(t, s.send(t, "k1", msg(testTo, "other")), http.StatusUnprocessableEntity,
		http.StatusUnprocessableEntity, "Idempotency-Key reused with a different request body")

	// The client gives up during the latency: the provider never sent the
	// message, so the key must become free again.
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("first request: %v, want context.Canceled", err)
	}
	testkit.WaitFor(t, 10*time.Second, "abandoned key to be released", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.entries["k1"]
		return !ok
	})
	if err := s.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	r := s.send(t, "k1", body)
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("after abandon: %d replayed=%v %s, want fresh 201", r.status, r.replayed(), r.body)
	}
	if got := s.Deliveries()["k1"]; got.Deliveries != 1 || got.Requests != 4 {
		t.Errorf("record %+v, want 1 delivery and 4 requests", got)
	}
}

func TestRetentionExpiry(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s := newStub(t, Config{Retention: time.Minute, Now: clock.Now})
	body := msg(testTo, testText)
	start := clock.Now()

	id1 := providerID(t, s.send(t, "k1", body))
	clock.Advance(time.Minute - time.Nanosecond)
	if r := s.send(t, "k1", body); !r.replayed() || providerID(t, r) != id1 {
		t.Fatalf("within retention: replayed=%v %s, want replay of %s", r.replayed(), r.body, id1)
	}
	// A replay makes no call: the delivery was taken when its request
	// arrived.
	if got := s.Taken()["k1"]; !got.Equal(start) {
		t.Errorf("after a replay: taken at %s, want %s", got, start)
	}
	clock.Advance(time.Nanosecond)
	r := s.send(t, "k1", body)
	if r.replayed() {
		t.Fatal("after retention: response was replayed, want a new delivery")
	}
	id2 := providerID(t, r)
	if id2 == id1 {
		t.Fatalf("after retention: same provider id %s", id1)
	}
	if r := s.send(t, "k1", body); !r.replayed() || providerID(t, r) != id2 {
		t.Fatalf("new entry: replayed=%v %s, want replay of %s", r.replayed(), r.body, id2)
	}
	want := Delivery{To: testTo, Deliveries: 2, Requests: 4, ProviderID: id2}
	if got := s.Deliveries()["k1"]; got != want {
		t.Errorf("record %+v, want %+v", got, want)
	}
	if got := s.Stats(); got.Keys != 1 || got.Deliveries != 2 || got.Replays != 2 {
		t.Errorf("Stats() = %+v, want 1 key, 2 deliveries, 2 replays", got)
	}
	if got, want := s.Taken()["k1"], start.Add(time.Minute); !got.Equal(want) {
		t.Errorf("second delivery taken at %s, want %s", got, want)
	}
}

// TestExpiredEntriesArePruned checks that expired responses are dropped
// from memory by later traffic, and that the expiry queue is compacted.
func TestExpiredEntriesArePruned(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s, err := New(Config{Retention: time.Minute, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	serve := func(key string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(msg(testTo, testText)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	const n = 3000
	for i := range n {
		if code := serve(fmt.Sprint("k", i)); code != http.StatusCreated {
			t.Fatalf("key %d: status %d", i, code)
		}
	}
	clock.Advance(time.Minute)
	if code := serve("fresh"); code != http.StatusCreated {
		t.Fatalf("fresh key: status %d", code)
	}
	s.mu.Lock()
	entries, queued := len(s.entries), len(s.expiry)-s.expiryHead
	head := s.expiryHead
	s.mu.Unlock()
	if entries != 1 || queued != 1 || head != 0 {
		t.Errorf("after expiry: %d entries, %d queued, head %d; want 1, 1, 0", entries, queued, head)
	}
	// Delivery records outlive their stored responses: they are the
	// evidence tests assert on.
	if got := s.Stats(); got.Keys != n+1 {
		t.Errorf("Stats().Keys = %d, want %d", got.Keys, n+1)
	}
}

func TestIgnoreKeys(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{IgnoreKeys: true})
	body := msg(testTo, testText)

	ids := map[string]bool{}
	for i, b := range []string{body, body, msg(testTo, "different")} {
		r := s.send(t, "k1", b)
		if r.replayed() {
			t.Fatalf("request %d replayed with IgnoreKeys", i)
		}
		ids[providerID(t, r)] = true
	}
	if len(ids) != 3 {
		t.Errorf("%d distinct provider ids, want 3", len(ids))
	}
	// Without idempotency the key is optional.
	providerID(t, s.send(t, "", body))

	got := s.Deliveries()
	if d := got["k1"]; d.Deliveries != 3 || d.Requests != 3 {
		t.Errorf("record k1 %+v, want 3 deliveries and 3 requests", d)
	}
	if d := got[""]; d.Deliveries != 1 {
		t.Errorf("record for the empty key %+v, want 1 delivery", d)
	}
	if st := s.Stats(); st.Deliveries != 4 || st.Replays != 0 || st.Keys != 2 {
		t.Errorf("Stats() = %+v, want 4 deliveries, 0 replays, 2 keys", st)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{APIKey: "sekret"})
	tests := []struct {
		name, auth string
		want       int
	}{
		{"missing", "", http.StatusUnauthorized},
		{"wrong key", "Bearer wrong", http.StatusUnauthorized},
		{"key prefix", "Bearer sekre", http.StatusUnauthorized},
		{"wrong scheme", "Basic sekret", http.StatusUnauthorized},
		{"no scheme", "sekret", http.StatusUnauthorized},
		{"correct", "Bearer sekret", http.StatusCreated},
		{"scheme is case-insensitive", "bearer sekret", http.StatusCreated},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := fmt.Sprint("auth-", i)
			r := s.send(t, key, msg(testTo, testText), withHeader("Authorization", tc.auth))
			if tc.want == http.StatusUnauthorized {
				wantError(t, r, http.StatusUnauthorized, CodeAuthFailed, "authentication failed")
				if r.header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
				if _, ok := s.Deliveries()[key]; ok {
					t.Error("unauthenticated request created a delivery record")
				}
				return
			}
			providerID(t, r)
		})
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	good := msg(testTo, testText)
	tests := []struct {
		name        string
		key         string
		body        string
		opts        []reqOption
		status      int
		code        int
		wantMessage string // checked exactly when non-empty
	}{
		{name: "missing key", body: good, status: 400, code: 400, wantMessage: "Idempotency-Key required"},
		{name: "key too long", key: strings.Repeat("k", MaxKeyLen+1), body: good, status: 400, code: 400},
		{name: "longest key", key: strings.Repeat("k", MaxKeyLen), body: good, status: 201},
		{name: "no content type", body: good, opts: []reqOption{withHeader("Content-Type", "")}, status: 415, code: 415},
		{name: "text content type", body: good, opts: []reqOption{withHeader("Content-Type", "text/plain")}, status: 415, code: 415},
		{name: "json with charset", body: good, opts: []reqOption{withHeader("Content-Type", "application/json; charset=utf-8")}, status: 201},
		{name: "bad JSON", body: `{"to":`, status: 400, code: 400},
		{name: "trailing data", body: good + `{}`, status: 400, code: 400},
		{name: "array", body: `[]`, status: 400, code: 400},
		{name: "to not a string", body: `{"to":15551234567,"body":"x"}`, status: 400, code: 400},
		{name: "missing to", body: `{"body":"x"}`, status: 400, code: CodeInvalidTo, wantMessage: "invalid To number"},
		{name: "to without plus", body: msg("15551234567", "x"), status: 400, code: CodeInvalidTo, wantMessage: "invalid To number"},
		{name: "to leading zero", body: msg("+05551234567", "x"), status: 400, code: CodeInvalidTo},
		{name: "to one digit", body: msg("+1", "x"), status: 400, code: CodeInvalidTo},
		{name: "to two digits", body: msg("+12", "x"), status: 201},
		{name: "to fifteen digits", body: msg("+123456789012345", "x"), status: 201},
		{name: "to sixteen digits", body: msg("+1234567890123456", "x"), status: 400, code: CodeInvalidTo},
		{name: "to with dash", body: msg("+1555-1234", "x"), status: 400, code: CodeInvalidTo},
		{name: "to with space", body: msg(" +15551234567", "x"), status: 400, code: CodeInvalidTo},
		{name: "empty text", body: msg(testTo, ""), status: 400, code: CodeBodyRequired, wantMessage: "message body is required"},
		{name: "missing text", body: `{"to":"+15551234567"}`, status: 400, code: CodeBodyRequired},
		{name: "1600 chars", body: msg(testTo, strings.Repeat("a", 1600)), status: 201},
		{name: "1601 chars", body: msg(testTo, strings.Repeat("a", 1601)), status: 400, code: CodeBodyTooLong},
		// Characters, not bytes: 1600 euro signs are 4800 bytes.
		{name: "1600 multibyte chars", body: msg(testTo, strings.Repeat("€", 1600)), status: 201},
		{name: "1601 multibyte chars", body: msg(testTo, strings.Repeat("€", 1601)), status: 400, code: CodeBodyTooLong},
		{name: "unknown field ignored", body: `{"to":"+15551234567","body":"x","from":"me"}`, status: 201},
		{name: "body over 64 KiB", body: `{"to":"+15551234567","body":"` + strings.Repeat("a", MaxRequestBytes) + `"}`, status: 413, code: 413},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStub(t, Config{})
			key := tc.key
			if key == "" && tc.name != "missing key" {
				key = "k1"
			}
			r := s.send(t, key, tc.body, tc.opts...)
			if tc.status == http.StatusCreated {
				providerID(t, r)
				return
			}
			if tc.wantMessage != "" {
				wantError(t, r, tc.status, tc.code, tc.wantMessage)
			} else if r.status != tc.status {
				t.Fatalf("status %d, want %d; body %s", r.status, tc.status, r.body)
			}
			var e errorResponse
			if err := json.Unmarshal(r.body, &e); err != nil || e.Code != tc.code || e.Message == "" {
				t.Fatalf("body %q (err %v), want code %d and a message", r.body, err, tc.code)
			}
			// Rejections are not stored: the key is still unused.
			if key != "" && len(key) <= MaxKeyLen {
				r := s.send(t, key, good)
				if r.replayed() {
					t.Fatal("a rejected request was stored")
				}
				providerID(t, r)
			}
			if got := s.Stats(); got.Deliveries > 1 {
				t.Errorf("Stats() = %+v", got)
			}
		})
	}
}

var e164 = regexp.MustCompile(`^\+[1-9][0-9]{1,14}$`)

// FuzzValidE164 checks the hand-written matcher against the contract's
// regular expression.
func FuzzValidE164(f *testing.F) {
	for _, s := range []string{"", "+", "+1", "+12", "+0", "+15551234567", "+123456789012345", "+1234567890123456", "++1", "+1a", "+1\n", "1555", "+٣٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validE164(s), e164.MatchString(s); got != want {
			t.Fatalf("validE164(%q) = %v, regexp says %v", s, got, want)
		}
	})
}

func TestInjectedFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		faults Faults
		status int
		code   int
	}{
		{"explicit status and code", Faults{FailRate: 1, FailStatus: 502, FailCode: 30008}, 502, 30008},
		{"defaults", Faults{FailRate: 1}, DefaultFailStatus, 0},
		{"client error", Faults{FailRate: 1, FailStatus: 400, FailCode: 21610}, 400, 21610},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStub(t, Config{Faults: tc.faults})
			body := msg(testTo, testText)
			for range 2 {
				wantError(t, s.send(t, "k1", body), tc.status, tc.code, "injected failure")
			}
			if got := s.Deliveries()["k1"]; got.Deliveries != 0 || got.Requests != 2 {
				t.Fatalf("record %+v, want 0 deliveries and 2 requests", got)
			}
			if err := s.SetFaults(Faults{}); err != nil {
				t.Fatal(err)
			}
			r := s.send(t, "k1", body)
			if r.replayed() {
				t.Fatal("failure was stored and replayed")
			}
			providerID(t, r)
			if got, want := s.Stats(), (Stats{Requests: 3, Deliveries: 1, Failures: 2, Keys: 1}); got != want {
				t.Errorf("Stats() = %+v, want %+v", got, want)
			}
		})
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		retryAfter time.Duration
		want       string
	}{
		{0, "1"},
		{time.Nanosecond, "1"},
		{time.Second, "1"},
		{1500 * time.Millisecond, "2"},
		{3 * time.Second, "3"},
	}
	for _, tc := range tests {
		t.Run(tc.retryAfter.String(), func(t *testing.T) {
			t.Parallel()
			// FailRate too: the rate limit is decided first.
			s := newStub(t, Config{Faults: Faults{RateLimitRate: 1, RetryAfter: tc.retryAfter, FailRate: 1}})
			r := s.send(t, "k1", msg(testTo, testText))
			wantError(t, r, http.StatusTooManyRequests, CodeRateLimited, "too many requests")
			if got := r.header.Get("Retry-After"); got != tc.want {
				t.Errorf("Retry-After %q, want %q", got, tc.want)
			}
			if err := s.SetFaults(Faults{}); err != nil {
				t.Fatal(err)
			}
			if r := s.send(t, "k1", msg(testTo, testText)); r.replayed() {
				t.Fatal("429 was stored and replayed")
			}
			if got := s.Stats(); got.RateLimited != 1 || got.Failures != 0 || got.Deliveries != 1 {
				t.Errorf("Stats() = %+v, want 1 rate limited, 0 failures, 1 delivery", got)
			}
		})
	}
}

func TestWithholdHang(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{WithholdRate: 1}})
	body := msg(testTo, testText)

	// The client gives up only once the stub holds the request: a deadline
	// alone could pass before the handler ran.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := post(ctx, s.client, s.url, "k1", body)
		errc <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "request to be withheld", func() bool { return s.Stats().Withheld == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("withheld request: %v, want the client to have given up", err)
	}
	rec := s.Deliveries()["k1"]
	if rec.Deliveries != 1 || rec.ProviderID == "" {
		t.Fatalf("record %+v, want the withheld message delivered", rec)
	}
	// The retry is answered even though faults are still on: replays are
	// never faulted.
	r := s.send(t, "k1", body)
	if !r.replayed() || providerID(t, r) != rec.ProviderID {
		t.Fatalf("retry: replayed=%v %s, want replay of %s", r.replayed(), r.body, rec.ProviderID)
	}
	if got, want := s.Stats(), (Stats{Requests: 2, Deliveries: 1, Replays: 1, Withheld: 1, Keys: 1}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

// TestCloseReleasesWithheld checks that Close frees hanging handlers, which
// is what lets the command shut down promptly.
func TestCloseReleasesWithheld(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{WithholdRate: 1}})
	body := msg(testTo, testText)

	errc := make(chan error, 1)
	go func() {
		_, err := post(context.Background(), s.client, s.url, "k1", body)
		errc <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "request to be withheld", func() bool { return s.Stats().Withheld == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("withheld request got a response after Close, want a dropped connection")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not release the withheld request")
	}
	// The stub still serves after Close; the message is replayed.
	if r := s.send(t, "k1", body); !r.replayed() {
		t.Fatalf("retry after Close: %d %s, want replay", r.status, r.body)
	}
}

func TestWithholdClose(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{WithholdRate: 1, WithholdMode: WithholdClose}})
	body := msg(testTo, testText)

	// A fresh transport, so the request goes out on a new connection and
	// net/http does not silently resend it (see the next test).
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := post(ctx, &http.Client{Transport: tr}, s.url, "k1", body)
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("withheld request: %v, want EOF or connection reset", err)
	}
	rec := s.Deliveries()["k1"]
	if rec.Deliveries != 1 {
		t.Fatalf("record %+v, want the withheld message delivered", rec)
	}
	r := s.send(t, "k1", body)
	if !r.replayed() || providerID(t, r) != rec.ProviderID {
		t.Fatalf("retry: replayed=%v %s, want replay of %s", r.replayed(), r.body, rec.ProviderID)
	}
	if got := s.Stats(); got.Withheld != 1 || got.Deliveries != 1 || got.Replays != 1 {
		t.Errorf("Stats() = %+v, want 1 withheld, 1 delivery, 1 replay", got)
	}
}

// TestWithholdCloseOnReusedConnection pins down a net/http behaviour that
// tests and the demo must know about: a request carrying Idempotency-Key
// whose reused keep-alive connection is closed before any response byte is
// transparently resent by http.Transport, so the caller sees the replay
// rather than the error. The stub still sees both requests.
func TestWithholdCloseOnReusedConnection(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{WithholdRate: 1, WithholdMode: WithholdClose}})
	// One connection at most, so the POST must reuse the warmed-up one.
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}

	resp, err := c.Get(s.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := post(ctx, c, s.url, "k1", msg(testTo, testText))
	if err != nil {
		t.Fatalf("POST on a reused connection: %v, want net/http to resend it", err)
	}
	if !r.replayed() {
		t.Fatalf("%d %s, want the replay", r.status, r.body)
	}
	if got := s.Deliveries()["k1"]; got.Deliveries != 1 || got.Requests != 2 {
		t.Errorf("record %+v, want 1 delivery and 2 requests", got)
	}
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{})
	ctx := context.Background()
	body := msg(testTo, testText)
	before := time.Now()
	id := providerID(t, s.send(t, "k1", body))
	after := time.Now()
	s.send(t, "k1", body)

	deliveries, err := FetchDeliveries(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Delivery{"k1": {To: testTo, Deliveries: 1, Requests: 2, ProviderID: id}}
	if !maps.Equal(deliveries, want) {
		t.Errorf("FetchDeliveries = %+v, want %+v", deliveries, want)
	}
	raw := getRaw(t, s.url+"/admin/deliveries")
	if strings.Contains(raw, testText) {
		t.Errorf("/admin/deliveries exposes the message text: %s", raw)
	}
	var fields map[string]map[string]any
	if err := json.Unmarshal([]byte(raw), &fields); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(fields["k1"]); got != "deliveries,provider_id,requests,to" {
		t.Errorf("delivery fields %s", got)
	}
	taken, err := FetchTaken(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := taken["k1"]; len(taken) != 1 || !ok || at.Before(before) || at.After(after) {
		t.Errorf("FetchTaken = %v, want k1 alone, taken between %s and %s", taken, before, after)
	}

	stats, err := FetchStats(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Stats{Requests: 2, Deliveries: 1, Replays: 1, Keys: 1}); stats != want {
		t.Errorf("FetchStats = %+v, want %+v", stats, want)
	}
	var statFields map[string]any
	if err := json.Unmarshal([]byte(getRaw(t, s.url+"/admin/stats")), &statFields); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(statFields); got != "conflicts,deliveries,dropped,expired,failures,keys,lookup_failures,lookups,mismatches,opted_out,over_limit,rate_limited,receipt_failures,receipts_given_up,receipts_lost,receipts_sent,replays,requests,withheld" {
		t.Errorf("stats fields %s", got)
	}

	if err := PostReset(ctx, s.url); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after reset: Stats() = %+v", got)
	}
	if got := s.Deliveries(); len(got) != 0 {
		t.Errorf("after reset: Deliveries() = %+v", got)
	}
	if got := s.Taken(); len(got) != 0 {
		t.Errorf("after reset: Taken() = %v", got)
	}
	if r := s.send(t, "k1", body); r.replayed() {
		t.Error("after reset: response replayed, want a new delivery")
	}

	resp, err := s.client.Get(s.url + "/admin/reset")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /admin/reset: %d, want 405", resp.StatusCode)
	}
	if _, err := FetchStats(ctx, s.url+"/nowhere"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("FetchStats on a wrong URL: %v, want a 404 error", err)
	}
}

// TestFaultsAtRunTime flips faults over HTTP the way a chaos test drives a
// stub running as a subprocess.
func TestFaultsAtRunTime(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{})
	ctx := context.Background()
	body := msg(testTo, testText)

	providerID(t, s.send(t, "k1", body))
	got, err := PostFaults(ctx, s.url, Faults{FailRate: 1, FailStatus: 500})
	if err != nil {
		t.Fatal(err)
	}
	want := Faults{FailRate: 1, FailStatus: 500, RetryAfter: DefaultRetryAfter, WithholdMode: WithholdHang}
	if got != want {
		t.Errorf("PostFaults = %+v, want %+v", got, want)
	}
	wantError(t, s.send(t, "k2", body), 500, 0, "injected failure")
	if r := s.send(t, "k1", body); !r.replayed() {
		t.Errorf("replay under faults: %d %s, want replay", r.status, r.body)
	}
	if _, err := PostFaults(ctx, s.url, Faults{}); err != nil {
		t.Fatal(err)
	}
	providerID(t, s.send(t, "k2", body))

	// Hand-written JSON, as a shell script would send.
	tests := []struct {
		name, body string
		status     int
		contains   string
	}{
		{"duration strings", `{"latency":"5ms","latency_jitter":"1ms","retry_after":"2s","withhold_mode":"close"}`, 200, `"latency":"5ms"`},
		{"duration nanoseconds", `{"latency":5000000}`, 200, `"latency":"5ms"`},
		{"rate out of range", `{"fail_rate":2}`, 400, "FailRate"},
		{"status out of range", `{"fail_rate":1,"fail_status":200}`, 400, "FailStatus"},
		{"bad mode", `{"withhold_mode":"drop"}`, 400, "WithholdMode"},
		{"bad duration", `{"latency":"soon"}`, 400, "duration"},
		{"unknown field", `{"fail_rte":1}`, 400, "fail_rte"},
		{"empty body", ``, 400, ""},
	}
	for _, tc := range tests {
		resp, err := s.client.Post(s.url+"/admin/faults", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.contains) {
			t.Errorf("%s: %d %s, want %d containing %q", tc.name, resp.StatusCode, b, tc.status, tc.contains)
		}
	}
	// Rejected updates leave the last good faults in force.
	if got := s.Faults(); got.Latency != 5*time.Millisecond || got.WithholdMode != WithholdHang {
		t.Errorf("Faults() = %+v after rejected updates", got)
	}
	if raw := getRaw(t, s.url+"/admin/faults"); !strings.Contains(raw, `"latency":"5ms"`) {
		t.Errorf("GET /admin/faults = %s", raw)
	}
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"negative retention", Config{Retention: -time.Second}, "Retention"},
		{"fail rate below 0", Config{Faults: Faults{FailRate: -0.1}}, "FailRate"},
		{"fail rate above 1", Config{Faults: Faults{FailRate: 1.1}}, "FailRate"},
		{"fail rate NaN", Config{Faults: Faults{FailRate: math.NaN()}}, "FailRate"},
		{"rate limit rate", Config{Faults: Faults{RateLimitRate: 2}}, "RateLimitRate"},
		{"withhold rate", Config{Faults: Faults{WithholdRate: -1}}, "WithholdRate"},
		{"fail status 399", Config{Faults: Faults{FailStatus: 399}}, "FailStatus"},
		{"fail status 600", Config{Faults: Faults{FailStatus: 600}}, "FailStatus"},
		{"fail code", Config{Faults: Faults{FailCode: -1}}, "FailCode"},
		{"retry after", Config{Faults: Faults{RetryAfter: -1}}, "RetryAfter"},
		{"latency", Config{Faults: Faults{Latency: -1}}, "Latency"},
		{"latency jitter", Config{Faults: Faults{LatencyJitter: -1}}, "LatencyJitter"},
		{"withhold mode", Config{Faults: Faults{WithholdMode: "drop"}}, "WithholdMode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("New: %v, want an error naming %s", err, tc.field)
			}
			s, err := New(Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SetFaults(tc.cfg.Faults); tc.field != "Retention" && (err == nil || !strings.Contains(err.Error(), tc.field)) {
				t.Fatalf("SetFaults: %v, want an error naming %s", err, tc.field)
			}
			if got := s.Faults(); got.FailRate != 0 || got.FailStatus != DefaultFailStatus {
				t.Fatalf("rejected SetFaults changed faults to %+v", got)
			}
		})
	}

	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := Faults{FailStatus: DefaultFailStatus, RetryAfter: DefaultRetryAfter, WithholdMode: WithholdHang}
	if got := s.Faults(); got != want {
		t.Errorf("default Faults() = %+v, want %+v", got, want)
	}
}

func TestFaultsJSON(t *testing.T) {
	t.Parallel()
	in := Faults{FailRate: 0.25, FailStatus: 502, FailCode: 30008, RateLimitRate: 0.5, RetryAfter: 2 * time.Second,
		RateLimit: 200, RateBurst: 20,
		Latency: 20 * time.Millisecond, LatencyJitter: 5 * time.Millisecond, WithholdRate: 0.1, WithholdMode: WithholdClose, GenericOnly: true}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"fail_rate":0.25,"fail_status":502,"fail_code":30008,"rate_limit_rate":0.5,"retry_after":"2s","rate_limit":200,"rate_burst":20,"latency":"20ms","latency_jitter":"5ms","withhold_rate":0.1,"withhold_mode":"close","drop_rate":0,"lookup_fail_rate":0,"receipt_loss_rate":0,"generic_only":true}`
	if string(b) != want {
		t.Errorf("marshal:\n got %s\nwant %s", b, want)
	}
	var out Faults
	if err := json.Unmarshal(b, &out); err != nil || out != in {
		t.Errorf("round trip: %+v, %v; want %+v", out, err, in)
	}
	if err := json.Unmarshal([]byte(`{"latency":null}`), &out); err != nil || out.Latency != 0 {
		t.Errorf("null latency: %+v, %v", out, err)
	}
}

// TestSeedIsReproducible checks that a seed fixes the fault sequence.
func TestSeedIsReproducible(t *testing.T) {
	t.Parallel()
	run := func() string {
		s := newStub(t, Config{Seed: 42, Faults: Faults{FailRate: 0.5}})
		var sb strings.Builder
		for i := range 32 {
			fmt.Fprint(&sb, s.send(t, fmt.Sprint("k", i), msg(testTo, testText)).status, " ")
		}
		return sb.String()
	}
	a, b := run(), run()
	if a != b {
		t.Fatalf("same seed, different outcomes:\n%s\n%s", a, b)
	}
	if !strings.Contains(a, "201") || !strings.Contains(a, "503") {
		t.Fatalf("FailRate 0.5 gave %s, want a mix", a)
	}
}

// TestLogsCarryNoSecrets drives every outcome with debug logging on and
// checks that no number, text, key or API key reaches the log.
func TestLogsCarryNoSecrets(t *testing.T) {
	t.Parallel()
	var logs testkit.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := newStub(t, Config{APIKey: "api-key-sekret", Logger: logger})
	auth := withHeader("Authorization", "Bearer api-key-sekret")
	body := msg(testTo, testText)

	id := providerID(t, s.send(t, "idem-key-sekret", body, auth))
	s.send(t, "idem-key-sekret", body, auth)
	s.send(t, "idem-key-sekret", msg(testTo, "other text"), auth)
	s.send(t, "idem-key-sekret", body)
	s.send(t, "idem-key-sekret", msg("+1", testText), auth)
	if err := s.SetFaults(Faults{FailRate: 1}); err != nil {
		t.Fatal(err)
	}
	s.send(t, "idem-key-sekret-2", body, auth)

	out := logs.String()
	for _, secret := range []string{"5551234567", testText, "other text", "idem-key-sekret", "api-key-sekret"} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
	// The message it took, at info: its id there and the number masked.
	for _, want := range []string{id, `"outcome":"replay"`, `"outcome":"mismatch"`, `"outcome":"failed"`, `"outcome":"rejected"`,
		`"msg":"message taken","outcome":"delivered","provider_id":"` + id + `","to":"+1********67"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
}

// TestManyClients is a race-detector workout: many keys, retries and
// replays at once, with totals checked at the end.
func TestManyClients(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{FailRate: 0.3, RateLimitRate: 0.1}})
	const clients, perClient = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Go(func() {
			ctx := context.Background()
			for i := range perClient {
				key := fmt.Sprintf("c%d-%d", c, i)
				body := msg(testTo, key)
				// Retry until delivered, then once more for a replay.
				for {
					r, err := post(ctx, s.client, s.url, key, body)
					if err != nil {
						errs <- err
						return
					}
					if r.status == http.StatusCreated {
						break
					}
				}
				if r, err := post(ctx, s.client, s.url, key, body); err != nil || !r.replayed() {
					errs <- fmt.Errorf("key %s: replay %v %d", key, err, r.status)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Deliveries != clients*perClient || st.Replays != clients*perClient || st.Keys != clients*perClient {
		t.Fatalf("Stats() = %+v, want %d deliveries, replays and keys", st, clients*perClient)
	}
	if st.Requests != st.Deliveries+st.Replays+st.Failures+st.RateLimited {
		t.Fatalf("Stats() = %+v: requests do not add up", st)
	}
	for k, d := range s.Deliveries() {
		if d.Deliveries != 1 {
			t.Fatalf("key %s: %+v, want exactly one delivery", k, d)
		}
	}
}

// BenchmarkMessages measures new deliveries over real sockets; run with
// -cpu 2 to check the >10k req/s budget.
func BenchmarkMessages(b *testing.B) {
	s, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	body := msg(testTo, testText)
	var n sync.Mutex
	seq := 0
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Lock()
			seq++
			key := fmt.Sprint("bench-", seq)
			n.Unlock()
			r, err := post(context.Background(), c, ts.URL, key, body)
			if err != nil || r.status != http.StatusCreated {
				b.Errorf("%v %d", err, r.status)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// Above its rate limit the stub answers 429 without Retry-After, as a
// provider's throughput tier does, and counts it apart from injected 429s.
func TestRateLimitTier(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{Faults: Faults{RateLimit: 1, RateBurst: 3}})
	statuses := map[int]int{}
	for i := range 6 {
		r := s.send(t, fmt.Sprintf("k-%d", i), msg("+15551234567", "x"))
		statuses[r.status]++
		if r.status == http.StatusTooManyRequests && r.header.Get("Retry-After") != "" {
			t.Errorf("a 429 for the rate limit carries Retry-After %q", r.header.Get("Retry-After"))
		}
	}
	// A burst of 3, and at 1/s at most one more token while the test runs.
	if statuses[201] < 3 || statuses[201] > 4 || statuses[429] != 6-statuses[201] {
		t.Fatalf("statuses %v, want 3 or 4 accepted and the rest 429", statuses)
	}
	if st := s.Stats(); st.OverLimit != int64(statuses[429]) || st.RateLimited != 0 {
		t.Fatalf("stats %+v", st)
	}
}
