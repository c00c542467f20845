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
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

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
