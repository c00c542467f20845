package smsstub

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// testStub is a Server behind a real HTTP listener.
type testStub struct {
	*Server
	url    string
	client *http.Client
}

// newStub starts a stub for cfg and stops it when the test ends.
func newStub(t *testing.T, cfg Config) *testStub {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(s.Handler())
	// Cleanups run last-in first-out: release withheld handlers first, or
	// ts.Close would wait for them forever.
	t.Cleanup(ts.Close)
	t.Cleanup(func() { _ = s.Close() })
	return &testStub{Server: s, url: ts.URL, client: ts.Client()}
}

// result is a response read in full.
type result struct {
	status int
	header http.Header
	body   []byte
}

func (r result) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// reqOption adjusts a request before it is sent.
type reqOption func(*http.Request)

func withHeader(name, value string) reqOption {
	return func(r *http.Request) {
		if value == "" {
			r.Header.Del(name)
			return
		}
		r.Header.Set(name, value)
	}
}

// post sends one /v1/messages request with the contract's headers.
func post(ctx context.Context, c *http.Client, baseURL, key, body string, opts ...reqOption) (result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/messages", strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for _, o := range opts {
		o(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// send is post for the test goroutine: it fails the test on transport
// errors.
func (s *testStub) send(t *testing.T, key, body string, opts ...reqOption) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := post(ctx, s.client, s.url, key, body, opts...)
	if err != nil {
		t.Fatalf("POST /v1/messages: %v", err)
	}
	return r
}

// msg returns a request body.
func msg(to, text string) string {
	b, err := json.Marshal(messageRequest{To: to, Body: text})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// providerID extracts the id from a 201 body.
func providerID(t *testing.T, r result) string {
	t.Helper()
	if r.status != http.StatusCreated {
		t.Fatalf("status %d, want 201; body %s", r.status, r.body)
	}
	var m messageResponse
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("decode 201 body %q: %v", r.body, err)
	}
	return m.ID
}

// wantError checks an error response's status and exact body.
func wantError(t *testing.T, r result, status, code int, message string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	want := mustJSON(errorResponse{Code: code, Message: message})
	if !bytes.Equal(r.body, want) {
		t.Fatalf("body %q, want %q", r.body, want)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
}

// fakeClock is a settable Config.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// getRaw GETs url and returns the body, failing the test unless it is 200.
func getRaw(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// keysOf returns m's keys, sorted and comma-separated.
func keysOf[V any](m map[string]V) string {
	return strings.Join(slices.Sorted(maps.Keys(m)), ",")
}

// TestMain fails the package if a test leaks a goroutine, such as a
// withheld handler that was never released.
func TestMain(m *testing.M) { testkit.Main(m) }
