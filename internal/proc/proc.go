// Package proc starts the sendonce binaries as child processes and watches
// them: the one supervisor behind the demo, the bench, the soak and the
// end-to-end process tests.
//
// A child's stdout and stderr go, line by line, to the Spec's Log. Every
// line that is a JSON log record (the binaries' default format) is also
// read: WARN and ERROR records are counted, and the record whose msg is the
// Spec's ReadyMsg ("relay started") marks the process ready. The first line
// on stdout is kept for Announced: the stub and the bench's NATS child print
// their address there.
//
// A child never inherits SENDONCE_CRASHPOINTS: a binary is armed only by
// the Env of its own Spec. On Linux a child is killed when its parent dies.
package proc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sendonce/sendonce/internal/crashpoint"
)

// Spec says what to start.
type Spec struct {
	// Name names the process in errors ("sender-2").
	Name string
	// Path is the binary; Args its arguments.
	Path string
	Args []string
	// Env is added to the parent's environment.
	Env []string
	// Log receives every line the process writes on stdout and stderr;
	// nil discards them. Writes are serialised.
	Log io.Writer
	// LogFile, when set, is a file the lines are appended to as well
	// (created if missing, closed when the process has exited).
	LogFile string
	// ReadyMsg is the msg of the JSON log record that says the process has
	// started; empty when it prints none.
	ReadyMsg string
	// Group puts the process in a process group of its own, so a terminal's
	// Ctrl-C reaches only the parent, which stops its children in order.
	Group bool
}

// Process is a running child.
type Process struct {
	name  string
	cmd   *exec.Cmd
	done  chan struct{}
	err   error
	first chan string
	ready chan time.Time

	warns, errs atomic.Int64
}

// Start starts the process described by spec.
func Start(spec Spec) (*Process, error) {
	var file *os.File
	if spec.LogFile != "" {
		f, err := os.OpenFile(spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("log of %s: %w", spec.Name, err)
		}
		file = f
		if spec.Log != nil {
			spec.Log = io.MultiWriter(spec.Log, f)
		} else {
			spec.Log = f
		}
	}
	p, err := start(spec)
	if file != nil {
		if err != nil {
			file.Close()
		} else {
			go func() { <-p.done; file.Close() }()
		}
	}
	return p, err
}

func start(spec Spec) (*Process, error) {
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = Environ(spec.Env...)
	cmd.SysProcAttr = sysProcAttr(spec.Group)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	p := &Process{name: spec.Name, cmd: cmd, done: make(chan struct{}),
		first: make(chan string, 1), ready: make(chan time.Time, 1)}
	log := &lineWriter{w: spec.Log}
	var announced atomic.Bool
	var pipes sync.WaitGroup
	pipes.Go(func() {
		firstLine := true
		p.lines(stdout, log, spec.ReadyMsg, &announced, func(line string) {
			if firstLine {
				p.first <- line
				firstLine = false
			}
		})
		close(p.first)
	})
	pipes.Go(func() { p.lines(stderr, log, spec.ReadyMsg, &announced, nil) })
	go func() {
		pipes.Wait() // Wait closes the pipes: read them to the end first
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// lines copies r to log line by line, reading each JSON record's level and
// msg; each line also goes to each, when set.
func (p *Process) lines(r io.Reader, log *lineWriter, readyMsg string, announced *atomic.Bool, each func(string)) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			log.write(line)
			text := strings.TrimRight(string(line), "\r\n")
			if each != nil {
				each(text)
			}
			p.record(text, readyMsg, announced)
		}
		if err != nil {
			return
		}
	}
}

// record counts a JSON log record's level and notices the ready record.
func (p *Process) record(line, readyMsg string, announced *atomic.Bool) {
	if !strings.HasPrefix(line, "{") {
		return
	}
	var rec struct {
		Time  time.Time `json:"time"`
		Level string    `json:"level"`
		Msg   string    `json:"msg"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil {
		return
	}
	switch rec.Level {
	case "WARN":
		p.warns.Add(1)
	case "ERROR":
		p.errs.Add(1)
	}
	if readyMsg != "" && rec.Msg == readyMsg && announced.CompareAndSwap(false, true) {
		p.ready <- rec.Time
	}
}

// lineWriter serialises whole lines from two pipes into one writer.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) write(b []byte) {
	if l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(b)
}

// Name returns the Spec's name.
func (p *Process) Name() string { return p.name }

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and its output is read.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns how the process ended (nil for exit status 0); valid once
// Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Status describes how the process ended, or "running".
func (p *Process) Status() string {
	if !p.Exited() {
		return "running"
	}
	return p.cmd.ProcessState.String()
}

// KilledBy reports whether the process has ended by sig.
func (p *Process) KilledBy(sig syscall.Signal) bool {
	if !p.Exited() {
		return false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends sig and waits up to bound for the exit; then it kills the
// process and waits for that. It reports whether the process exited within
// bound.
func (p *Process) Stop(sig syscall.Signal, bound time.Duration) bool {
	if p.Exited() {
		return true
	}
	_ = p.cmd.Process.Signal(sig)
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return false
}

// Warnings and Errors return how many WARN and ERROR records the process
// has logged.
func (p *Process) Warnings() int64 { return p.warns.Load() }

// Errors: see Warnings.
func (p *Process) Errors() int64 { return p.errs.Load() }

// Ready waits up to d for the ReadyMsg record and returns its time.
func (p *Process) Ready(ctx context.Context, d time.Duration) (time.Time, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case at := <-p.ready:
		return at, nil
	case <-p.done:
		return time.Time{}, fmt.Errorf("%s exited during start-up: %v (see its log)", p.name, p.err)
	case <-t.C:
		return time.Time{}, fmt.Errorf("%s not started within %s", p.name, d)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// Announced waits up to d for the first line on stdout, which must start
// with prefix, and returns the rest: "smsstub listening on " gives the
// stub's URL.
func (p *Process) Announced(ctx context.Context, prefix string, d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case line, ok := <-p.first:
		if !ok {
			return "", fmt.Errorf("%s closed its stdout before printing its address (%s; see its log)", p.name, p.Status())
		}
		rest, found := strings.CutPrefix(line, prefix)
		if !found {
			return "", fmt.Errorf("%s printed %q, want %q...", p.name, line, prefix)
		}
		return strings.TrimSpace(rest), nil
	case <-t.C:
		return "", fmt.Errorf("%s printed no address within %s", p.name, d)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// StopAll sends SIGTERM to every process at once, so they drain side by
// side, then waits up to bound in all for them to exit and kills those
// still running. It returns the processes that had to be killed.
func StopAll(bound time.Duration, ps ...*Process) []*Process {
	for _, p := range ps {
		if !p.Exited() {
			_ = p.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	var killed []*Process
	expired := false
	for _, p := range ps {
		if !expired {
			select {
			case <-p.done:
			case <-deadline.C:
				expired = true
			}
		}
		if p.Exited() {
			continue
		}
		_ = p.cmd.Process.Kill()
		<-p.done
		killed = append(killed, p)
	}
	return killed
}

// Run runs a binary to its end (relay migrate) and returns its combined
// output; the environment is as for Start.
func Run(ctx context.Context, path string, args, env []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = Environ(env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s", filepath.Base(path), strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Environ returns the parent's environment without SENDONCE_CRASHPOINTS,
// then extra.
func Environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, crashpoint.Env+"=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// Binaries checks that dir holds each named binary.
func Binaries(dir string, names ...string) error {
	var errs []error
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			errs = append(errs, fmt.Errorf("binary %s not found in %s (run make build): %w", n, dir, err))
		}
	}
	return errors.Join(errs...)
}
