// Package testkit holds what every test package needs the same way: waiting
// on a condition, a buffer that running code may write logs into while the
// test reads it, a getenv backed by a map, and a TestMain that fails the
// package when a test leaked a goroutine.
//
// It is for tests only; nothing outside _test.go files imports it.
package testkit

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"

	"go.uber.org/goleak"
)

// WaitFor polls cond until it holds and fails the test after d, naming
// what it waited for. It asserts on state, never on elapsed time: d is a
// generous bound for a slow machine, not a measurement.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// Buffer is a bytes.Buffer that is safe for concurrent use: the stderr of
// a command a test runs, a log sink of a component.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// EnvMap returns a getenv that reads m, for a run(ctx, args, getenv, ...)
// under test.
func EnvMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// Main runs the package's tests, then the after functions (closing what
// TestMain opened), then fails the run if a goroutine is still running that
// was not there before. Keep-alive connections of http.DefaultTransport are
// closed first: they are idle, not leaked. It does not return.
func Main(m *testing.M, after ...func()) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// SettingsDoc checks that the section name of docs/configuration.md is
// the table of the settings bind binds: a program's own flag definitions.
// With SENDONCE_UPDATE_DOCS=1 (make docs) it rewrites the section instead.
func SettingsDoc[C any](t *testing.T, name string, bind func(*envflag.Set, *C)) {
	t.Helper()
	s := envflag.New(name, EnvMap(nil), io.Discard)
	bind(s, new(C))
	path := filepath.Join(RepoRoot(t), "docs", "configuration.md")
	want := envflag.Markdown(s.Settings())
	if os.Getenv("SENDONCE_UPDATE_DOCS") == "1" {
		if err := updateSection(path, name, want); err != nil {
			t.Fatal(err)
		}
		return
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := envflag.Section(string(doc), name)
	if !ok {
		t.Fatalf("docs/configuration.md has no section %q (a line %q, the table, then %q)", name, envflag.SectionStart(name), envflag.SectionEnd(name))
	}
	if got != want {
		t.Fatalf("docs/configuration.md: the settings of %s differ from its flags%s\nregenerate the tables with: make docs", name, lineDiff(got, want))
	}
}

// RepoRoot is the module's root: the directory of the go.mod nearest
// above the test's directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// updateSection rewrites one section of the document at path, holding an
// exclusive lock on the file so that test packages running side by side
// do not lose each other's sections.
func updateSection(path, name, body string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	doc, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	out, ok := envflag.ReplaceSection(string(doc), name, body)
	if !ok {
		return fmt.Errorf("%s has no section %q (a line %q, the table, then %q)", path, name, envflag.SectionStart(name), envflag.SectionEnd(name))
	}
	if out == string(doc) {
		return nil
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(out), 0)
	return err
}

// lineDiff lists the lines only one side has.
func lineDiff(got, want string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for l := range strings.Lines(s) {
			m[l] = true
		}
		return m
	}
	g, w := in(got), in(want)
	var b strings.Builder
	for l := range strings.Lines(got) {
		if !w[l] {
			b.WriteString("\n  documented, not a flag: " + strings.TrimSpace(l))
		}
	}
	for l := range strings.Lines(want) {
		if !g[l] {
			b.WriteString("\n  a flag, not documented:  " + strings.TrimSpace(l))
		}
	}
	return b.String()
}
