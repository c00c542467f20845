package proc_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// TestMain doubles as the child: PROC_TEST_CHILD names what it does.
func TestMain(m *testing.M) {
	switch os.Getenv("PROC_TEST_CHILD") {
	case "":
		testkit.Main(m)
	case "serve":
		// Like a binary: an address on stdout, JSON records on stderr,
		// then wait for SIGTERM and exit 0.
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Println("child listening on http://127.0.0.1:1")
		fmt.Fprintln(os.Stderr, `{"time":"2030-01-02T03:04:05Z","level":"WARN","msg":"slow"}`)
		fmt.Fprintf(os.Stderr, `{"time":"2030-01-02T03:04:06Z","level":"INFO","msg":"child started","crashpoints":%q}`+"\n", os.Getenv(crashpoint.Env))
		fmt.Fprintln(os.Stderr, `{"time":"2030-01-02T03:04:07Z","level":"ERROR","msg":"bad"}`)
		fmt.Fprintln(os.Stderr, "not json")
		<-term
		fmt.Fprintln(os.Stderr, `{"level":"INFO","msg":"stopped"}`)
		os.Exit(0)
	case "hang":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("hanging")
		select {}
	case "exit3":
		os.Exit(3)
	}
}

func child(t *testing.T, mode string, log io.Writer) *proc.Process {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p, err := proc.Start(proc.Spec{Name: mode, Path: exe, Args: []string{"-test.run=^$"},
		Env: []string{"PROC_TEST_CHILD=" + mode}, Log: log, ReadyMsg: "child started"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(syscall.SIGKILL, time.Second) })
	return p
}

func TestStartReadyAnnouncedStop(t *testing.T) {
	// Not parallel: it sets the parent's crash point variable.
	t.Setenv(crashpoint.Env, crashpoint.SenderAfterAccept+"=1")
	ctx := context.Background()
	var log testkit.Buffer
	p := child(t, "serve", &log)
	url, err := p.Announced(ctx, "child listening on ", 30*time.Second)
	if err != nil || url != "http://127.0.0.1:1" {
		t.Fatalf("Announced = %q, %v", url, err)
	}
	at, err := p.Ready(ctx, 30*time.Second)
	if err != nil || !at.Equal(time.Date(2030, 1, 2, 3, 4, 6, 0, time.UTC)) {
		t.Fatalf("Ready = %s, %v", at, err)
	}
	testkit.WaitFor(t, 30*time.Second, "the error record", func() bool { return p.Errors() == 1 })
	if !p.Stop(syscall.SIGTERM, 30*time.Second) || p.Err() != nil || p.KilledBy(syscall.SIGKILL) {
		t.Fatalf("stop: %v (%s)", p.Err(), p.Status())
	}
	if p.Warnings() != 1 || p.Errors() != 1 {
		t.Errorf("warnings %d, errors %d; want 1 and 1", p.Warnings(), p.Errors())
	}
	out := log.String()
	for _, want := range []string{"child listening on", `"msg":"slow"`, "not json\n", `"msg":"stopped"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, `"crashpoints":""`) {
		t.Errorf("the child inherited %s:\n%s", crashpoint.Env, out)
	}
}

func TestStopKillsWhatIgnoresTheSignal(t *testing.T) {
	t.Parallel()
	p := child(t, "hang", nil)
	if _, err := p.Announced(context.Background(), "hanging", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Stop(syscall.SIGTERM, 100*time.Millisecond) {
		t.Fatal("Stop reports a clean exit for a process that ignores SIGTERM")
	}
	if !p.KilledBy(syscall.SIGKILL) || !p.Exited() {
		t.Fatalf("ended %s, want killed", p.Status())
	}
}

func TestEarlyExitIsReported(t *testing.T) {
	t.Parallel()
	p := child(t, "exit3", nil)
	if _, err := p.Ready(context.Background(), 30*time.Second); err == nil || !strings.Contains(err.Error(), "exited during start-up") {
		t.Fatalf("Ready = %v", err)
	}
	if _, err := p.Announced(context.Background(), "x", 30*time.Second); err == nil {
		t.Fatal("Announced succeeded for a process that printed nothing")
	}
	if p.Err() == nil || !strings.Contains(p.Status(), "exit status 3") {
		t.Fatalf("ended %s, %v", p.Status(), p.Err())
	}
}

func TestRunAndBinaries(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proc.Run(context.Background(), exe, []string{"-test.run=^$"}, []string{"PROC_TEST_CHILD=exit3"}); err == nil {
		t.Fatal("Run reports success for exit status 3")
	}
	dir, name := filepathSplit(exe)
	if err := proc.Binaries(dir, name); err != nil {
		t.Fatal(err)
	}
	if err := proc.Binaries(dir, "no-such-binary"); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("Binaries(missing) = %v", err)
	}
}

func filepathSplit(p string) (string, string) {
	i := strings.LastIndexByte(p, '/')
	return p[:i], p[i+1:]
}

func TestStopAll(t *testing.T) {
	t.Parallel()
	serving, hanging := child(t, "serve", nil), child(t, "hang", nil)
	ctx := context.Background()
	if _, err := serving.Ready(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := hanging.Announced(ctx, "hanging", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	killed := proc.StopAll(2*time.Second, hanging, serving)
	if len(killed) != 1 || killed[0] != hanging {
		t.Fatalf("killed %v, want only the hanging one", killed)
	}
	if serving.Err() != nil {
		t.Fatalf("the serving child ended %s", serving.Status())
	}
}

func TestLogFile(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/child.log"
	for range 2 {
		p, err := proc.Start(proc.Spec{Name: "serve", Path: exe, Args: []string{"-test.run=^$"},
			Env: []string{"PROC_TEST_CHILD=serve"}, LogFile: path, ReadyMsg: "child started"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Ready(context.Background(), 30*time.Second); err != nil {
			t.Fatal(err)
		}
		p.Stop(syscall.SIGTERM, 30*time.Second)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"msg":"stopped"`); n != 2 {
		t.Fatalf("the log file holds %d of the two runs:\n%s", n, b)
	}
}
