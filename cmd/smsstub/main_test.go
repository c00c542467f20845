package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

var listening = regexp.MustCompile(`^smsstub listening on (http://127\.0\.0\.1:[1-9][0-9]*)$`)

// running is a run call in progress.
type running struct {
	url    string
	stop   context.CancelFunc
	done   chan int
	stderr *testkit.Buffer
}

// start calls run in the background and waits for its listening line.
func start(t *testing.T, env map[string]string, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout := &lineWriter{lines: make(chan string, 8)}
	r := &running{stop: cancel, done: make(chan int, 1), stderr: &testkit.Buffer{}}
	go func() {
		r.done <- run(ctx, append([]string{"smsstub", "-addr", "127.0.0.1:0"}, args...), testkit.EnvMap(env), stdout, r.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("run did not return after cancel")
		}
	})
	select {
	case line := <-stdout.lines:
		m := listening.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("stdout line %q does not announce the address", line)
		}
		r.url = m[1]
	case code := <-r.done:
		r.done <- code // for the cleanup
		t.Fatalf("run exited with %d before listening; stderr:\n%s", code, r.stderr)
	case <-time.After(10 * time.Second):
		t.Fatalf("no listening line; stderr:\n%s", r.stderr)
	}
	return r
}

// shutdown cancels run and returns its exit status.
func (r *running) shutdown(t *testing.T) int {
	t.Helper()
	r.stop()
	select {
	case code := <-r.done:
		r.done <- code // for the cleanup
		return code
	case <-time.After(10 * time.Second):
		t.Fatalf("run did not return after cancel; stderr:\n%s", r.stderr)
		return -1
	}
}

// runSync calls run to completion with a cancelled context, for start-up
// errors.
func runSync(env map[string]string, args ...string) (code int, stdout, stderr string) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut bytes.Buffer
	code = run(ctx, append([]string{"smsstub"}, args...), testkit.EnvMap(env), &out, &errOut)
	return code, out.String(), errOut.String()
}

// sendMessage posts one message and returns the status.
func sendMessage(t *testing.T, baseURL, key, apiKey string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := postMessage(ctx, baseURL, key, apiKey)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func postMessage(ctx context.Context, baseURL, key, apiKey string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/messages",
		strings.NewReader(`{"to":"+15551234567","body":"Your code is 482901"}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	return http.DefaultClient.Do(req)
}

func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	r := start(t, map[string]string{"SMS_API_KEY": "env-api-key", "STUB_LOG_FORMAT": "text"})

	if got := sendMessage(t, r.url, "k1", ""); got != http.StatusUnauthorized {
		t.Errorf("without API key: %d, want 401", got)
	}
	if got := sendMessage(t, r.url, "k1", "env-api-key"); got != http.StatusCreated {
		t.Errorf("with API key: %d, want 201", got)
	}
	st, err := smsstub.FetchStats(context.Background(), r.url)
	if err != nil {
		t.Fatal(err)
	}
	if st.Deliveries != 1 || st.Requests != 2 {
		t.Errorf("stats %+v, want 1 delivery of 2 requests", st)
	}
	if code := r.shutdown(t); code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, r.stderr)
	}
	logs := r.stderr.String()
	if !strings.Contains(logs, "msg=stopped") {
		t.Errorf("text logs lack the stop record:\n%s", logs)
	}
	if strings.Contains(logs, "env-api-key") {
		t.Errorf("logs contain the API key:\n%s", logs)
	}
}

// TestRunSettings checks that environment variables set faults and that
// flags override them.
func TestRunSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want int
	}{
		{"env fault", map[string]string{"STUB_FAIL_RATE": "1", "STUB_FAIL_STATUS": "502"}, nil, 502},
		{"flag fault", nil, []string{"-fail-rate", "1", "-fail-status", "504"}, 504},
		{"flag overrides env", map[string]string{"STUB_FAIL_RATE": "1"}, []string{"-fail-rate=0"}, 201},
		{"env rate limit", map[string]string{"STUB_RATE_LIMIT_RATE": "1"}, nil, 429},
		{"bool flag without value", nil, []string{"-ignore-keys", "-fail-rate", "0"}, 201},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := start(t, tc.env, tc.args...)
			if got := sendMessage(t, r.url, "k1", ""); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRunIgnoreKeysFromEnv(t *testing.T) {
	t.Parallel()
	r := start(t, map[string]string{"STUB_IGNORE_KEYS": "true"})
	for range 2 {
		sendMessage(t, r.url, "k1", "")
	}
	d, err := smsstub.FetchDeliveries(context.Background(), r.url)
	if err != nil {
		t.Fatal(err)
	}
	if d["k1"].Deliveries != 2 {
		t.Errorf("deliveries %+v, want 2 for k1", d)
	}
}

func TestRunBadEnv(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"STUB_RETENTION":        "forever",
		"STUB_IGNORE_KEYS":      "maybe",
		"STUB_FAIL_RATE":        "1.5",
		"STUB_FAIL_STATUS":      "200",
		"STUB_FAIL_CODE":        "x",
		"STUB_RATE_LIMIT_RATE":  "-1",
		"STUB_RETRY_AFTER":      "0s",
		"STUB_LATENCY":          "-1ms",
		"STUB_LATENCY_JITTER":   "1",
		"STUB_WITHHOLD_RATE":    "NaN",
		"STUB_WITHHOLD_MODE":    "drop",
		"STUB_SEED":             "1.5",
		"STUB_LOG_FORMAT":       "xml",
		"STUB_LOG_LEVEL":        "loud",
		"STUB_SHUTDOWN_TIMEOUT": "0",
	}
	for env, val := range tests {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runSync(map[string]string{env: val})
			if code != 2 || !strings.Contains(stderr, env) {
				t.Fatalf("exit %d, stderr %q; want 2 and an error naming %s", code, stderr, env)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}

func TestRunBadFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		flag string
	}{
		{[]string{"-fail-rate", "2"}, "-fail-rate"},
		{[]string{"-fail-status", "399"}, "-fail-status"},
		{[]string{"-fail-code", "-1"}, "-fail-code"},
		{[]string{"-rate-limit-rate", "x"}, "-rate-limit-rate"},
		{[]string{"-retention", "0"}, "-retention"},
		{[]string{"-retry-after", "soon"}, "-retry-after"},
		{[]string{"-latency", "-1s"}, "-latency"},
		{[]string{"-latency-jitter", "-1s"}, "-latency-jitter"},
		{[]string{"-withhold-rate", "1.01"}, "-withhold-rate"},
		{[]string{"-withhold-mode", "drop"}, "-withhold-mode"},
		{[]string{"-seed", "x"}, "-seed"},
		{[]string{"-log-format", "xml"}, "-log-format"},
		{[]string{"-log-level", "loud"}, "-log-level"},
		{[]string{"-ignore-keys=maybe"}, "-ignore-keys"},
		{[]string{"-shutdown-timeout", "-1s"}, "-shutdown-timeout"},
		{[]string{"-no-such-flag"}, "-no-such-flag"},
	}
	for _, tc := range tests {
		t.Run(tc.flag, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runSync(nil, tc.args...)
			firstLine, _, _ := strings.Cut(stderr, "\n")
			if code != 2 || !strings.Contains(firstLine, tc.flag) {
				t.Fatalf("exit %d, stderr %q; want 2 and an error naming %s", code, stderr, tc.flag)
			}
		})
	}
}

func TestRunUsage(t *testing.T) {
	t.Parallel()
	code, _, stderr := runSync(map[string]string{"SMS_API_KEY": "env-api-key", "STUB_FAIL_RATE": "0.25"}, "-h")
	if code != 0 {
		t.Fatalf("-h: exit %d, want 0", code)
	}
	for _, want := range []string{"-withhold-mode", "STUB_WITHHOLD_MODE", "SMS_API_KEY", "(env STUB_FAIL_RATE, set, default 0)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("usage lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "env-api-key") {
		t.Errorf("usage shows the API key:\n%s", stderr)
	}

	if code, _, stderr := runSync(nil, "extra"); code != 2 || !strings.Contains(stderr, "extra") {
		t.Errorf("positional argument: exit %d, stderr %q; want 2", code, stderr)
	}
}

func TestRunListenError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, stdout, stderr := runSync(nil, "-addr", ln.Addr().String())
	if code != 1 || !strings.Contains(stderr, "listen") {
		t.Fatalf("exit %d, stderr %q; want 1 and a listen error", code, stderr)
	}
	if stdout != "" {
		t.Errorf("stdout %q, want no listening line", stdout)
	}
}

// TestRunShutdownReleasesWithheld checks that a request withheld in hang
// mode does not hold shutdown to its (here very long) deadline.
func TestRunShutdownReleasesWithheld(t *testing.T) {
	t.Parallel()
	r := start(t, nil, "-withhold-rate", "1", "-shutdown-timeout", "10m")

	clientErr := make(chan error, 1)
	go func() {
		resp, err := postMessage(context.Background(), r.url, "k1", "")
		if err == nil {
			_ = resp.Body.Close()
			err = fmt.Errorf("got a response: %s", resp.Status)
		}
		clientErr <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := smsstub.FetchStats(context.Background(), r.url)
		if err != nil {
			t.Fatal(err)
		}
		if st.Withheld == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("request was not withheld: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code := r.shutdown(t); code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, r.stderr)
	}
	select {
	case err := <-clientErr:
		if err == nil {
			t.Fatal("withheld client got no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("withheld client still blocked after shutdown")
	}
}

// TestRunFaultsViaAdmin drives the process the way a chaos test does.
func TestRunFaultsViaAdmin(t *testing.T) {
	t.Parallel()
	r := start(t, nil)
	ctx := context.Background()
	if _, err := smsstub.PostFaults(ctx, r.url, smsstub.Faults{FailRate: 1}); err != nil {
		t.Fatal(err)
	}
	if got := sendMessage(t, r.url, "k1", ""); got != http.StatusServiceUnavailable {
		t.Errorf("with faults: %d, want 503", got)
	}
	if _, err := smsstub.PostFaults(ctx, r.url, smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	if got := sendMessage(t, r.url, "k1", ""); got != http.StatusCreated {
		t.Errorf("faults off: %d, want 201", got)
	}
	if err := smsstub.PostReset(ctx, r.url); err != nil {
		t.Fatal(err)
	}
	if st, err := smsstub.FetchStats(ctx, r.url); err != nil || st != (smsstub.Stats{}) {
		t.Errorf("after reset: %+v, %v", st, err)
	}
}

// lineWriter hands complete lines to a channel, for waiting on the
// listening line without polling.
type lineWriter struct {
	mu    sync.Mutex
	buf   []byte
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case w.lines <- string(w.buf[:i]):
		default: // nobody is listening for more lines
		}
		w.buf = w.buf[i+1:]
	}
}

func TestMain(m *testing.M) { testkit.Main(m) }

// docs/configuration.md lists every setting, generated from bind (make docs).
func TestSettingsDoc(t *testing.T) { testkit.SettingsDoc(t, "smsstub", bind) }
