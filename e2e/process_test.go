package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/outbox"
)

var (
	binDir   string
	buildErr error
)

// build builds relay, sender and smsstub (with -race, and with the crash
// points compiled in) for the package's subprocess tests.
func build() {
	binDir, buildErr = os.MkdirTemp("", "sendonce-e2e-bin-")
	if buildErr != nil {
		return
	}
	cmd := exec.Command("go", "build", "-race", "-tags", crashpoint.Tag, "-o", binDir+"/", "../cmd/relay", "../cmd/sender", "../cmd/smsstub")
	if out, err := cmd.CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build: %v\n%s", err, out)
	}
}

// binaries returns the directory holding the binaries.
func binaries(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// TestMain builds the binaries before any test runs: a race build takes
// both cores for a while, and inside a test it would slow down whichever
// timing-sensitive tests ran beside it.
func TestMain(m *testing.M) {
	build()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// process is a running binary with its output captured.
type process struct {
	*proc.Process
	logs *testkit.Buffer
}

func startProcess(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	p := &process{logs: &testkit.Buffer{}}
	var err error
	p.Process, err = proc.Start(proc.Spec{Name: name, Path: filepath.Join(binaries(t), name), Args: args, Env: env, Log: p.logs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(syscall.SIGKILL, time.Minute)
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, p.logs.String())
		}
	})
	return p
}

// waitExit waits up to d for the process to exit on its own and returns
// how it ended.
func (p *process) waitExit(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-p.Done():
		return p.Err()
	case <-time.After(d):
		t.Fatalf("%s did not exit within %s", p.Name(), d)
		return nil
	}
}

// stop sends SIGTERM and returns the exit error and how long the exit took.
func (p *process) stop(t *testing.T, bound time.Duration) (error, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := p.waitExit(t, bound)
	return err, time.Since(start)
}

// SIGTERM to a sender with attempts in flight: it stops fetching, finishes
// the attempts and their status writes, acks, and exits 0; no row is left
// sending, and a second sender finishes the rest with one delivery each.
// Every log line of every component is then scanned for numbers, bodies and
// the API key.
func TestGracefulShutdownAndLogScan(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	const apiKey = "process-test-key-51f0"
	stub := startProcess(t, "smsstub", []string{"SMS_API_KEY=" + apiKey, "STUB_LOG_LEVEL=debug"},
		"-addr", "127.0.0.1:0", "-latency", "300ms", "-fail-rate", "0.1", "-withhold-rate", "0.02")
	stubURL, err := stub.Announced(context.Background(), smsstub.Announcement, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{
		"DATABASE_URL=" + url, "NATS_URL=" + srv.URL(), "HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=debug",
		"SMS_API_BASE=" + stubURL, "SMS_API_ALLOW_INSECURE=true", "SMS_API_KEY=" + apiKey, "SMS_API_TIMEOUT=1s", "RETRY_BASE=50ms", "RETRY_CAP=500ms",
		"SENDER_CONCURRENCY=16", "SHUTDOWN_TIMEOUT=20s", "RELAY_POLL_INTERVAL=100ms",
	}
	relayProc := startProcess(t, "relay", env)
	first := startProcess(t, "sender", env)

	pool := newPool(t, url)
	ids := make([]string, 0)
	rows := insertVia(t, pool, 300)
	for _, id := range rows {
		ids = append(ids, id.String())
	}
	ctx := context.Background()
	testkit.WaitFor(t, 60*time.Second, "some rows sent and some in flight", func() bool {
		var sent, sending int
		_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status = 'sending') FROM sms_outbox`).Scan(&sent, &sending)
		return sent >= 20 && sending > 0
	})
	err, took := first.stop(t, 30*time.Second)
	if err != nil {
		t.Fatalf("sender exit: %v (after %s)\n%s", err, took, first.logs.String())
	}
	var sending int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE status = 'sending'`).Scan(&sending)
	if sending != 0 {
		t.Fatalf("%d rows left sending after a graceful shutdown", sending)
	}
	t.Logf("sender drained and exited 0 in %s", took.Round(time.Millisecond))

	second := startProcess(t, "sender", env)
	final := waitAllTerminal(t, pool, len(rows), 2*time.Minute)
	deliveries, err := smsstub.FetchDeliveries(ctx, stubURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if final[id] != outbox.StatusSent {
			t.Errorf("row %s ended %s", id, final[id])
		}
		if n := deliveries[id].Deliveries; n != 1 {
			t.Errorf("row %s delivered %d times", id, n)
		}
	}
	for _, p := range []*process{second, relayProc, stub} {
		if err, took := p.stop(t, 30*time.Second); err != nil {
			t.Errorf("%s exit after %s: %v", p.Name(), took, err)
		}
	}

	// I5: no number, body or key in any component's logs.
	all := relayProc.logs.String() + first.logs.String() + second.logs.String() + stub.logs.String()
	lines := strings.Count(all, "\n")
	if lines < 100 {
		t.Fatalf("only %d log lines captured; the scan would prove nothing", lines)
	}
	for i := range rows {
		for _, secret := range []string{testPhone(i), testBody(i), testPhone(i)[1:]} {
			if strings.Contains(all, secret) {
				t.Fatalf("a log line contains %q", secret)
			}
		}
	}
	if strings.Contains(all, apiKey) {
		t.Fatal("a log line contains the API key")
	}
	for line := range strings.Lines(all) {
		if strings.Count(line, `"component":`) > 1 {
			t.Errorf("a log line names its component twice: %s", line)
			break
		}
	}
	for _, component := range []string{`"component":"relay"`, `"component":"sender"`} {
		if !strings.Contains(all, component) {
			t.Errorf("no log line has %s", component)
		}
	}
	t.Logf("scanned %d log lines from relay, 2 senders and the stub: no number, body or key", lines)
}
