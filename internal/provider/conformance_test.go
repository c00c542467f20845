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

	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

// The conformance tests of every adapter check its requests against its
// provider's published OpenAPI document, kept under testdata/<provider>
// with a README that says where it comes from: this file is what they
// share, the check that the document is the published one and Prism, the
// validating mock that serves it.

// publishedSpec reads spec, failing the test unless the README beside it
// gives its sha256: a document changed by hand, or replaced without saying
// where the new one comes from, is no longer the provider's word. It
// returns the document, for a test's own checks of it.
func publishedSpec(t *testing.T, spec string) []byte {
	t.Helper()
	doc, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(filepath.Dir(spec), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := fmt.Sprintf("%x", sha256.Sum256(doc)); !bytes.Contains(readme, []byte("| sha256 | `"+sum+"` |")) {
		t.Errorf("%s has sha256 %s, which its README does not give: say where the new one comes from", spec, sum)
	}
	return doc
}

// specServer is the server URL spec gives on the line after marker (the
// documents write their servers differently), failing the test when there
// is none.
func specServer(t *testing.T, spec, marker string) *url.URL {
	t.Helper()
	doc, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(doc, []byte(marker))
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	u, err := url.Parse(strings.Trim(string(line), `'" `))
	if !ok || err != nil || u.Host == "" {
		t.Fatalf("the document names no server URL (%q)", line)
	}
	return u
}

// roundTrip is an http.RoundTripper made of a function: a transport that
// records the request and answers without a network.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

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
