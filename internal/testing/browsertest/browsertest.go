// Package browsertest drives a real headless Chromium from tests, through
// ChromeDriver's W3C WebDriver HTTP API: open a page, find elements by CSS
// selector, click, type, read text, take screenshots. It needs Debian's
// chromium and chromium-driver packages (/usr/bin/chromium and
// /usr/bin/chromedriver); a test that asks for a browser fails without
// them, unless SENDONCE_SKIP_BROWSER=1 says this machine has none (for a
// developer's laptop; CI never sets it).
//
// Screenshots go to the directory SENDONCE_SCREENSHOTS names, or to the
// test's temporary directory.
//
// It is for tests only; nothing outside _test.go files imports it.
package browsertest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// SkipEnv names the variable that, set to 1, skips browser tests.
const SkipEnv = "SENDONCE_SKIP_BROWSER"

// ScreenshotsEnv names the variable holding the screenshots' directory.
const ScreenshotsEnv = "SENDONCE_SCREENSHOTS"

// elementKey is the W3C name of an element reference in JSON.
const elementKey = "element-6066-11e4-a52e-4f735466cecf"

// Browser is one headless Chromium session.
type Browser struct {
	t       testing.TB
	base    string
	session string
	http    *http.Client
	driver  *proc.Process
	shots   string
}

// Start starts ChromeDriver and a headless Chromium with a fresh profile,
// both stopped when the test ends.
func Start(t testing.TB) *Browser {
	t.Helper()
	if os.Getenv(SkipEnv) == "1" {
		t.Skipf("%s=1: no browser on this machine", SkipEnv)
	}
	chromium, err1 := exec.LookPath("chromium")
	driver, err2 := exec.LookPath("chromedriver")
	if err1 != nil || err2 != nil {
		t.Fatalf("browsertest: chromium and chromedriver are needed (apt-get install chromium chromium-driver), or set %s=1 to skip browser tests", SkipEnv)
	}
	b := &Browser{t: t, http: &http.Client{Timeout: 60 * time.Second}, shots: os.Getenv(ScreenshotsEnv)}
	if b.shots == "" {
		b.shots = t.TempDir()
	} else if err := os.MkdirAll(b.shots, 0o755); err != nil {
		t.Fatal(err)
	}
	var log testkit.Buffer
	for range 5 {
		port := testport.Reserve(t)
		b.base = "http://127.0.0.1:" + strconv.Itoa(port)
		b.driver, err1 = proc.Start(proc.Spec{Name: "chromedriver", Path: driver,
			Args: []string{"--port=" + strconv.Itoa(port)}, Log: &log})
		if err1 != nil {
			t.Fatalf("browsertest: %v", err1)
		}
		if b.waitReady(15 * time.Second) {
			break
		}
		b.driver.Stop(syscall.SIGKILL, 5*time.Second)
		b.driver = nil
	}
	if b.driver == nil {
		t.Fatalf("browsertest: chromedriver did not start:\n%s", log.String())
	}
	t.Cleanup(b.close)
	profile := t.TempDir()
	var created struct {
		SessionID string `json:"sessionId"`
	}
	b.call("POST", "/session", map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{"binary": chromium, "args": []string{
			"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--disable-dev-shm-usage", "--window-size=1280,1100", "--user-data-dir=" + profile,
		}},
	}}}, &created)
	b.session = created.SessionID
	return b
}

func (b *Browser) waitReady(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && !b.driver.Exited() {
		res, err := b.http.Get(b.base + "/status")
		if err == nil {
			var st struct {
				Value struct {
					Ready bool `json:"ready"`
				} `json:"value"`
			}
			err = json.NewDecoder(res.Body).Decode(&st)
			res.Body.Close()
			if err == nil && st.Value.Ready {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func (b *Browser) close() {
	if b.session != "" {
		req, _ := http.NewRequest("DELETE", b.base+"/session/"+b.session, nil)
		if res, err := b.http.Do(req); err == nil {
			res.Body.Close()
		}
	}
	b.http.CloseIdleConnections()
	if b.driver != nil {
		b.driver.Stop(syscall.SIGTERM, 10*time.Second)
	}
}

// call runs one WebDriver command and decodes its value into out.
func (b *Browser) call(method, path string, body, out any) {
	b.t.Helper()
	if err := b.try(method, path, body, out); err != nil {
		b.t.Fatalf("browsertest: %s %s: %v", method, path, err)
	}
}

type wdError struct {
	Code    string `json:"error"`
	Message string `json:"message"`
}

func (e *wdError) Error() string { return e.Code + ": " + firstLine(e.Message) }

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func (b *Browser) try(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, b.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := b.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	var env struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.NewDecoder(res.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: %w", res.Status, err)
	}
	if res.StatusCode != http.StatusOK {
		var e wdError
		if json.Unmarshal(env.Value, &e) == nil && e.Code != "" {
			return &e
		}
		return fmt.Errorf("%s: %s", res.Status, env.Value)
	}
	if out != nil {
		return json.Unmarshal(env.Value, out)
	}
	return nil
}

func (b *Browser) path(p string) string { return "/session/" + b.session + p }

// Open loads url and waits for it to load.
func (b *Browser) Open(url string) {
	b.t.Helper()
	b.call("POST", b.path("/url"), map[string]string{"url": url}, nil)
}

// URL returns the page's address.
func (b *Browser) URL() string {
	b.t.Helper()
	var u string
	b.call("GET", b.path("/url"), nil, &u)
	return u
}

// Element is an element of the current page.
type Element struct {
	b  *Browser
	id string
}

// FindAll returns the elements matching a CSS selector (maybe none).
func (b *Browser) FindAll(css string) []Element {
	b.t.Helper()
	var refs []map[string]string
	b.call("POST", b.path("/elements"), map[string]string{"using": "css selector", "value": css}, &refs)
	out := make([]Element, len(refs))
	for i, r := range refs {
		out[i] = Element{b: b, id: r[elementKey]}
	}
	return out
}

// Wait waits up to d for an element matching css and returns the first,
// failing the test if none appears.
func (b *Browser) Wait(css string, d time.Duration) Element {
	b.t.Helper()
	deadline := time.Now().Add(d)
	for {
		if els := b.FindAll(css); len(els) > 0 {
			return els[0]
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("browsertest: no %s on %s after %s", css, b.URL(), d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Find is Wait with a short bound: the element must be on the page.
func (b *Browser) Find(css string) Element {
	b.t.Helper()
	return b.Wait(css, 5*time.Second)
}

// Click clicks the element.
func (e Element) Click() {
	e.b.t.Helper()
	e.b.call("POST", e.b.path("/element/"+e.id+"/click"), map[string]any{}, nil)
}

// Type types text into the element.
func (e Element) Type(text string) {
	e.b.t.Helper()
	e.b.call("POST", e.b.path("/element/"+e.id+"/value"), map[string]string{"text": text}, nil)
}

// Text returns the element's rendered text.
func (e Element) Text() string {
	e.b.t.Helper()
	var s string
	e.b.call("GET", e.b.path("/element/"+e.id+"/text"), nil, &s)
	return s
}

// Selected reports whether a checkbox or option is selected.
func (e Element) Selected() bool {
	e.b.t.Helper()
	var v bool
	e.b.call("GET", e.b.path("/element/"+e.id+"/selected"), nil, &v)
	return v
}

// Attr returns an attribute's value ("" when absent).
func (e Element) Attr(name string) string {
	e.b.t.Helper()
	var v *string
	e.b.call("GET", e.b.path("/element/"+e.id+"/attribute/"+name), nil, &v)
	if v == nil {
		return ""
	}
	return *v
}

// Eval runs a script in the page and returns its result.
func (b *Browser) Eval(script string, args ...any) json.RawMessage {
	b.t.Helper()
	if args == nil {
		args = []any{}
	}
	var v json.RawMessage
	b.call("POST", b.path("/execute/sync"), map[string]any{"script": script, "args": args}, &v)
	return v
}

// Screenshot saves the page as name.png in the screenshots' directory and
// returns the file's path.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	var data string
	b.call("GET", b.path("/screenshot"), nil, &data)
	png, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		b.t.Fatalf("browsertest: screenshot: %v", err)
	}
	p := filepath.Join(b.shots, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s", p)
	return p
}
