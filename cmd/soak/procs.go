package main

import (
	"bytes"
	"context"
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

// slot is one long-lived role (relay-1, sender-2, ...): the process that
// currently fills it and how to start another. mu is held by whoever acts on
// the slot (a fault, the watchdog, the restore), for the whole action.
type slot struct {
	s      *soak
	name   string
	bin    string
	env    []string
	logDir string

	mu     sync.Mutex
	cur    atomic.Pointer[proc]
	starts int
}

func (s *soak) newSlot(name, bin string, env []string) *slot {
	return &slot{s: s, name: name, bin: bin, env: env, logDir: s.logDir}
}

// proc is one incarnation of a slot's process.
type proc struct {
	cmd     *exec.Cmd
	started chan struct{} // closed when the process logged that it started
	done    chan struct{} // closed when the process exited
	state   *os.ProcessState
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// killedBy reports whether the process was ended by sig.
func (p *proc) killedBy(sig syscall.Signal) bool {
	if p.state == nil {
		return false
	}
	ws, ok := p.state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// status describes how the process ended.
func (p *proc) status() string {
	if p.state == nil {
		return "not ended"
	}
	return p.state.String()
}

// stop sends sig and waits up to bound for the exit, then kills the process.
// It reports whether the process exited within bound.
func (p *proc) stop(sig syscall.Signal, bound time.Duration) bool {
	if p.exited() {
		return true
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return true
	case <-time.After(bound):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	return false
}

// running reports whether the slot has a live process.
func (sl *slot) running() bool {
	p := sl.cur.Load()
	return p != nil && !p.exited()
}

// spawn starts one incarnation; extra is added to the environment (crash
// points). Its stdout and stderr are appended to the slot's log file.
func (sl *slot) spawn(extra []string) (*proc, error) {
	f, err := os.OpenFile(filepath.Join(sl.logDir, sl.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	sl.starts++
	fmt.Fprintf(f, "{\"soak\":\"start\",\"incarnation\":%d,\"time\":%q,\"extra_env\":%q}\n",
		sl.starts, time.Now().Format(time.RFC3339Nano), strings.Join(extra, " "))
	p := &proc{started: make(chan struct{}), done: make(chan struct{})}
	w := &startWatcher{w: f, marker: []byte(fmt.Sprintf(`"msg":"%s started"`, sl.bin)), started: p.started}
	cmd := exec.Command(filepath.Join(sl.s.cfg.binDir, sl.bin))
	cmd.Env = append(append(childEnviron(), sl.env...), extra...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = childAttrs()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", sl.name, err)
	}
	p.cmd = cmd
	go func() {
		_ = cmd.Wait()
		p.state = cmd.ProcessState
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// startLocked starts the slot's process and waits until it logged that it
// started; a process that exits before that is counted as an unexpected exit
// and started again, a few times. The caller holds sl.mu.
func (sl *slot) startLocked(ctx context.Context, extra []string) error {
	const tries = 6
	for try := 1; ; try++ {
		p, err := sl.spawn(extra)
		if err != nil {
			return err
		}
		sl.cur.Store(p)
		select {
		case <-p.started:
			return nil
		case <-time.After(30 * time.Second):
			sl.s.logf("%s: no start-up line within 30s; going on", sl.name)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
		}
		sl.s.unexpected.Add(1)
		sl.s.logf("%s exited during start-up (%s, try %d of %d); see %s.log", sl.name, p.status(), try, tries, sl.name)
		if try == tries {
			return fmt.Errorf("%s does not start", sl.name)
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// watchdog restarts a process that exited on its own (one no fault was
// acting on) and counts it.
func (s *soak) watchdog(ctx context.Context) {
	defer close(s.watchdogDone)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.watchdogStop:
			return
		case <-tick.C:
		}
		for _, sl := range s.slots() {
			if !sl.mu.TryLock() {
				continue
			}
			if p := sl.cur.Load(); p != nil && p.exited() {
				s.unexpected.Add(1)
				s.logf("UNEXPECTED: %s exited on its own (%s); restarting it; see %s.log", sl.name, p.status(), sl.name)
				if err := sl.startLocked(ctx, nil); err != nil {
					s.logf("restart %s: %v", sl.name, err)
				}
			}
			sl.mu.Unlock()
		}
	}
}

// startWatcher passes a process's output to w and closes started once a
// line contains marker.
type startWatcher struct {
	w       io.Writer
	marker  []byte
	started chan struct{}
	seen    bool
	tail    []byte
}

// Write implements io.Writer.
func (sw *startWatcher) Write(b []byte) (int, error) {
	if !sw.seen {
		// Look at what is left of the previous write too, so that a marker
		// split between two writes is found.
		buf := append(sw.tail, b...)
		if bytes.Contains(buf, sw.marker) {
			sw.seen = true
			close(sw.started)
			sw.tail = nil
		} else {
			keep := min(len(buf), len(sw.marker))
			sw.tail = append([]byte(nil), buf[len(buf)-keep:]...)
		}
	}
	return sw.w.Write(b)
}

// childEnviron is this process's environment without the variables that
// would change what a child does behind the soak's back.
func childEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, crashpoint.Env+"=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// childAttrs puts a child in its own process group (a terminal's Ctrl-C
// reaches only the soak, which stops the children in order) and kills it if
// the soak dies.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// stubProc is the provider stub's process.
type stubProc struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

// startStub starts bin/smsstub on a free port and reads its URL from the
// line it prints once listening.
func startStub(ctx context.Context, binDir, logDir, apiKey string) (*stubProc, error) {
	f, err := os.Create(filepath.Join(logDir, "smsstub.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(binDir, "smsstub"), "-addr", "127.0.0.1:0")
	cmd.Env = append(childEnviron(), "SMS_API_KEY="+apiKey)
	first := make(chan string, 1)
	cmd.Stdout = &lineCatcher{w: f, first: first}
	cmd.Stderr = f
	cmd.SysProcAttr = childAttrs()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start smsstub: %w", err)
	}
	sp := &stubProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(sp.done)
	}()
	var line string
	select {
	case line = <-first:
	case <-sp.done:
		return nil, errors.New("smsstub exited before printing its address; see smsstub.log")
	case <-time.After(10 * time.Second):
		sp.stop()
		return nil, errors.New("smsstub printed no address within 10s")
	case <-ctx.Done():
		sp.stop()
		return nil, ctx.Err()
	}
	u, ok := strings.CutPrefix(line, "smsstub listening on ")
	if !ok {
		sp.stop()
		return nil, fmt.Errorf("smsstub printed %q", line)
	}
	sp.url = strings.TrimSpace(u)
	return sp, nil
}

// lineCatcher passes output to w and sends its first line to first.
type lineCatcher struct {
	w     io.Writer
	first chan<- string
	buf   []byte
	sent  bool
}

// Write implements io.Writer.
func (lc *lineCatcher) Write(b []byte) (int, error) {
	if !lc.sent {
		lc.buf = append(lc.buf, b...)
		if i := bytes.IndexByte(lc.buf, '\n'); i >= 0 {
			lc.first <- string(lc.buf[:i])
			lc.sent, lc.buf = true, nil
		}
	}
	return lc.w.Write(b)
}

// stop ends the stub with SIGTERM, SIGKILL after 15s.
func (sp *stubProc) stop() {
	_ = sp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-sp.done:
		return
	case <-time.After(15 * time.Second):
	}
	_ = sp.cmd.Process.Kill()
	select {
	case <-sp.done:
	case <-time.After(10 * time.Second):
	}
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
