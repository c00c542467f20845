package provider_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

// vonageSpec is Vonage's published OpenAPI document of the Messages API
// (testdata/vonage/README.md says where it comes from).
const vonageSpec = "testdata/vonage/messages-olympus.yml"

// vonageErratum is the one line the conformance test takes out of the
// published document: its baseMessageType requires a property "message"
// that no message type defines and that neither Vonage's API nor its SDKs
// send (testdata/vonage/README.md).
const vonageErratum = "      required:\n        - to\n        - from\n        - message\n        - message_type\n"

// prismExchange is one request Prism validated, as the proxy in front of
// it saw it.
type prismExchange struct {
	method     string
	uri        string // the path and query the client asked for
	body       []byte
	status     int
	violations []prismViolation
}

type prismViolation struct {
	Location []string `json:"location"`
	Severity string   `json:"severity"`
	Code     any      `json:"code"` // a keyword, or a status (401)
	Message  string   `json:"message"`
}

// requestViolations are the violations of the request (Prism also reports
// its own mock answers' against the document's responses).
func (x prismExchange) requestViolations() []prismViolation {
	var out []prismViolation
	for _, v := range x.violations {
		if len(v.Location) > 0 && v.Location[0] == "request" {
			out = append(out, v)
		}
	}
	return out
}

// vonageServer is the document's server URL: its paths ("/") are under it.
func vonageServer(t *testing.T) *url.URL {
	t.Helper()
	doc, err := os.ReadFile(vonageSpec)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(doc, []byte("\nservers:\n  - url: "))
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	u, err := url.Parse(strings.Trim(string(line), `'" `))
	if !ok || err != nil || u.Host == "" {
		t.Fatalf("the document names no server URL (%q)", line)
	}
	return u
}

// The document is the one testdata/vonage/README.md names, unchanged.
func TestVonageSpecIsThePublishedOne(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(vonageSpec)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(filepath.Dir(vonageSpec), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := fmt.Sprintf("%x", sha256.Sum256(doc)); !bytes.Contains(readme, []byte("| sha256 | `"+sum+"` |")) {
		t.Errorf("%s has sha256 %s, which its README does not give: say where the new one comes from", vonageSpec, sum)
	}
}

// The adapter's default base URL is the document's server.
func TestVonageDefaultBaseIsTheDocumentsServer(t *testing.T) {
	t.Parallel()
	if got, want := "https://api.nexmo.com/v1/messages", vonageServer(t).String(); got != want {
		t.Errorf("the adapter POSTs to %s, the document's server is %s", got, want)
	}
}

// startPrism runs Stoplight Prism as a validating mock of spec and returns
// the base URL of a proxy in front of it, which records every exchange
// (Prism's sl-violations header, or the violations of the answer Prism
// makes up when the document defines none: problemViolations) and, when
// prefer is set, asks Prism for that answer (its Prefer header:
// "code=429"). Prism serves the document's paths without its server's
// path, so the proxy takes serverPath (Vonage's /v1/messages, Telnyx's
// /v2) off the front of a request's path: any other path stays, and
// Prism answers it 404 unless the document has it.
func startPrism(t *testing.T, spec, serverPath string) (base string, prefer func(string), exchanges func() []prismExchange) {
	t.Helper()
	prism := nodetools.Bin(t, "prism")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(prism, "mock", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--multiprocess=false", spec)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	listening := make(chan struct{})
	var logMu sync.Mutex
	var log bytes.Buffer
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			logMu.Lock()
			log.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if strings.Contains(sc.Text(), "Prism is listening") {
				once.Do(func() { close(listening) })
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case <-listening:
	case <-exited:
		t.Fatalf("prism exited before it listened:\n%s", log.String())
	case <-time.After(90 * time.Second):
		logMu.Lock()
		defer logMu.Unlock()
		t.Fatalf("prism did not listen within 90s:\n%s", log.String())
	}

	target, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(port))
	var (
		mu   sync.Mutex
		pref string
		xs   []prismExchange
	)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		vs := parseViolations(resp.Header.Get("sl-violations"))
		if len(vs) == 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
			answer, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			resp.Body = io.NopCloser(bytes.NewReader(answer))
			vs = problemViolations(resp.StatusCode, answer)
		}
		body, _ := resp.Request.Context().Value(bodyKey{}).([]byte)
		uri, _ := resp.Request.Context().Value(uriKey{}).(string)
		mu.Lock()
		xs = append(xs, prismExchange{method: resp.Request.Method, uri: uri, body: body, status: resp.StatusCode, violations: vs})
		mu.Unlock()
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		ctx := context.WithValue(context.WithValue(r.Context(), bodyKey{}, body), uriKey{}, r.URL.RequestURI())
		if rest, ok := strings.CutPrefix(r.URL.Path, serverPath); serverPath != "" && ok && (rest == "" || strings.HasPrefix(rest, "/")) {
			r.URL.Path = cmp.Or(rest, "/")
		}
		mu.Lock()
		if pref != "" {
			r.Header.Set("Prefer", pref)
		}
		mu.Unlock()
		proxy.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func(p string) {
			mu.Lock()
			pref = p
			mu.Unlock()
		}, func() []prismExchange {
			mu.Lock()
			defer mu.Unlock()
			return append([]prismExchange(nil), xs...)
		}
}

type (
	bodyKey struct{}
	uriKey  struct{}
)

// problemViolations are the request violations of an answer Prism made up
// itself (application/problem+json) because the document defines none for
// the case: a 422 lists them under "validation", with locations that leave
// out "request"; a 401 (no or wrong credentials) has none listed, and
// counts as one. Any other made-up answer (a 404 for a path the document
// lacks, a 500 of Prism's) is one too: the request was not the document's.
func problemViolations(status int, answer []byte) []prismViolation {
	var p struct {
		Title      string           `json:"title"`
		Validation []prismViolation `json:"validation"`
	}
	_ = json.Unmarshal(answer, &p)
	var vs []prismViolation
	for _, v := range p.Validation {
		v.Location = append([]string{"request"}, v.Location...)
		vs = append(vs, v)
	}
	if len(vs) == 0 {
		vs = []prismViolation{{Location: []string{"request"}, Code: status, Message: p.Title}}
	}
	return vs
}

// parseViolations reads Prism's sl-violations header: a JSON list, which
// Prism prefixes with "Too many violations! " and cuts short when long.
// The violations before the cut are kept; a header of which nothing can be
// read still counts as a request violation.
func parseViolations(h string) []prismViolation {
	if h == "" {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(strings.TrimPrefix(h, "Too many violations! ")))
	var vs []prismViolation
	if tok, err := dec.Token(); err == nil && tok == json.Delim('[') {
		for dec.More() {
			var v prismViolation
			if dec.Decode(&v) != nil {
				break
			}
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		vs = []prismViolation{{Location: []string{"request"}, Message: "unreadable sl-violations: " + h[:min(len(h), 200)]}}
	}
	return vs
}

// correctedSpec writes the published document less its erratum to a
// temporary file: the erratum must be there, once.
func correctedSpec(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(vonageSpec)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(doc, []byte(vonageErratum)); n != 1 {
		t.Fatalf("the published document has the erratum %d times, want once: has testdata/vonage changed?", n)
	}
	fixed := bytes.Replace(doc, []byte(vonageErratum), []byte("      required:\n        - to\n        - from\n        - message_type\n"), 1)
	p := filepath.Join(t.TempDir(), "messages-olympus.yml")
	if err := os.WriteFile(p, fixed, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestVonageConformsToPublishedSpec points the Vonage adapter at Prism
// serving Vonage's own OpenAPI document, over real HTTP: every request it
// makes must be valid for the document (no request violation, and the
// document's 202), and it must classify each error answer the document
// defines, in the shape the document gives it, as docs/providers.md says.
func TestVonageConformsToPublishedSpec(t *testing.T) {
	t.Parallel()
	base, prefer, exchanges := startPrism(t, correctedSpec(t), vonageServer(t).Path)
	msgs := []provider.Message{
		testMsg,
		{Key: "7d4b5a8e-3c21-4f7e-9b0a-1e2d3c4b5a69", To: "+447700900000", Body: "ünïcode ✓ and \"quotes\"\nand a newline"},
		{Key: "3f1e2d3c-4b5a-4697-8a1b-2c3d4e5f6a7b", To: "+4915112345678", Body: strings.Repeat("long ", 150)},
	}
	for _, receipts := range []string{"", "https://receipts.example.com"} {
		for _, from := range []string{"+15550001111", "Acme"} {
			c, err := provider.NewVonage(provider.VonageConfig{BaseURL: base, APIKey: "abcd1234", APISecret: "s3cret-secret", From: from, ReceiptsURL: receipts, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				o := c.Send(context.Background(), m)
				if o.Kind != provider.Sent || o.HTTPStatus != http.StatusAccepted || o.Ref != "aaaaaaaa-bbbb-cccc-dddd-0123456789ab" {
					t.Errorf("from %q, receipts %q: outcome %+v, want Sent 202 with the document's message_uuid", from, receipts, o)
				}
			}
		}
	}
	xs := exchanges()
	if len(xs) != 12 {
		t.Fatalf("prism saw %d requests, want 12", len(xs))
	}
	for _, x := range xs {
		if v := x.requestViolations(); len(v) > 0 || x.status != http.StatusAccepted {
			t.Errorf("request %s: status %d, violations %+v", x.body, x.status, v)
		}
	}

	// Each error the document defines for the send, with its example body.
	tests := []struct {
		prefer string
		want   provider.Kind
		status int
	}{
		{"code=401", provider.Permanent, 401},
		{"code=402", provider.Retry, 402},
		{"code=422", provider.Permanent, 422},
		{"code=429", provider.Retry, 429},
		{"code=500", provider.Ambiguous, 500},
	}
	c, err := provider.NewVonage(provider.VonageConfig{BaseURL: base, APIKey: "abcd1234", APISecret: "s3cret-secret", From: "Acme", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		prefer(tt.prefer)
		o := c.Send(context.Background(), testMsg)
		if o.Kind != tt.want || o.HTTPStatus != tt.status || o.Reason == "" || o.Reason == http.StatusText(tt.status) {
			t.Errorf("%s: outcome %+v, want %v with the document's error title as reason", tt.prefer, o, tt.want)
		}
		assertNoSecrets(t, o)
	}
	for _, x := range exchanges()[12:] {
		if v := x.requestViolations(); len(v) > 0 {
			t.Errorf("request %s: violations %+v", x.body, v)
		}
	}
}

// The mock does validate: a request the document does not allow is
// answered 422 with its violations, and the published document, erratum
// included, refuses the adapter's requests for the lack of "message" (so
// the erratum is what the test corrects, and all it corrects).
func TestPrismValidatesVonageRequests(t *testing.T) {
	t.Parallel()
	base, _, exchanges := startPrism(t, correctedSpec(t), vonageServer(t).Path)
	post := func(body string) {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("abcd1234", "s3cret-secret")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	post(`{"message_type":"text","channel":"sms","from":"Acme","text":"no to"}`)
	post(`{"message_type":"text","channel":"sms","to":"1555","from":"Acme","text":"to too short"}`)
	post(`{"message_type":"text","channel":"sms","to":"15551234567","from":"Acme"}`)
	for _, x := range exchanges() {
		if x.status != http.StatusUnprocessableEntity || len(x.requestViolations()) == 0 {
			t.Errorf("invalid request %s: status %d, violations %+v; want 422 with violations", x.body, x.status, x.violations)
		}
	}

	published, _, pubExchanges := startPrism(t, vonageSpec, vonageServer(t).Path)
	c, err := provider.NewVonage(provider.VonageConfig{BaseURL: published, APIKey: "abcd1234", APISecret: "s3cret-secret", From: "Acme", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if o := send(t, c); o.Kind != provider.Permanent || o.HTTPStatus != http.StatusUnprocessableEntity {
		t.Errorf("at the published document: outcome %+v, want its 422", o)
	}
	xs := pubExchanges()
	if len(xs) != 1 {
		t.Fatalf("prism saw %d requests, want 1", len(xs))
	}
	// Every branch of the oneOf but SMS fails on channel or message type
	// as well; the SMS branch fails on "message" alone.
	var missing bool
	for _, v := range xs[0].requestViolations() {
		if v.Code == "required" && strings.Contains(v.Message, "'message'") {
			missing = true
		}
		if v.Code == "invalid security scheme" || fmt.Sprint(v.Code) == "401" {
			t.Errorf("the published document refused the adapter's credentials: %+v", v)
		}
		if v.Code == "required" && !strings.Contains(v.Message, "'message'") && strings.Contains(v.Message, "'text'") {
			t.Errorf("the published document says the text is missing: %+v", v)
		}
	}
	if !missing {
		t.Errorf("the published document refused the request, but not for the lack of message: %+v", xs[0].violations)
	}
}

// startPrismAt is startPrism, by the name the Sinch tests use.
func startPrismAt(t *testing.T, spec, serverPath string) (base string, prefer func(string), exchanges func() []prismExchange) {
	t.Helper()
	return startPrism(t, spec, serverPath)
}
