package testkit_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// fatalTB records a Fatalf instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

func TestWaitFor(t *testing.T) {
	t.Parallel()
	n := 0
	testkit.WaitFor(t, 10*time.Second, "the third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}

	f := &fatalTB{TB: t}
	testkit.WaitFor(f, 30*time.Millisecond, "something that never happens", func() bool { return f.msg != "" })
	if !strings.Contains(f.msg, "something that never happens") {
		t.Fatalf("failure message %q does not say what was awaited", f.msg)
	}
}

func TestBufferTakesConcurrentWrites(t *testing.T) {
	t.Parallel()
	var b testkit.Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprint(&b, "x")
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Fatalf("%d bytes, want 800", n)
	}
}

func TestEnvMap(t *testing.T) {
	t.Parallel()
	getenv := testkit.EnvMap(map[string]string{"A": "1"})
	if getenv("A") != "1" || getenv("B") != "" {
		t.Fatal("EnvMap does not read its map")
	}
}
