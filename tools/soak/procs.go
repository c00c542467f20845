package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/smsstub"
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
	cur    atomic.Pointer[proc.Process]
	starts int
}

func (s *soak) newSlot(name, bin string, env []string) *slot {
	return &slot{s: s, name: name, bin: bin, env: env, logDir: s.logDir}
}

// running reports whether the slot has a live process.
func (sl *slot) running() bool {
	p := sl.cur.Load()
	return p != nil && !p.Exited()
}

// spawn starts one incarnation; extra is added to the environment (crash
// points). Its output is appended to the slot's log file, after a line that
// marks the incarnation.
func (sl *slot) spawn(extra []string) (*proc.Process, error) {
	path := filepath.Join(sl.logDir, sl.name+".log")
	sl.starts++
	mark := fmt.Sprintf("{\"soak\":\"start\",\"incarnation\":%d,\"time\":%q,\"extra_env\":%q}\n",
		sl.starts, time.Now().Format(time.RFC3339Nano), strings.Join(extra, " "))
	if err := appendFile(path, mark); err != nil {
		return nil, err
	}
	return proc.Start(proc.Spec{Name: sl.name, Path: filepath.Join(sl.s.cfg.binDir, sl.bin),
		Env: append(sl.env[:len(sl.env):len(sl.env)], extra...), LogFile: path,
		ReadyMsg: sl.bin + " started", Group: true})
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
		_, err = p.Ready(ctx, 30*time.Second)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !p.Exited():
			sl.s.logf("%s: no start-up line within 30s; going on", sl.name)
			return nil
		}
		sl.s.unexpected.Add(1)
		sl.s.logf("%s exited during start-up (%s, try %d of %d); see %s.log", sl.name, p.Status(), try, tries, sl.name)
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
			if p := sl.cur.Load(); p != nil && p.Exited() {
				s.unexpected.Add(1)
				s.logf("UNEXPECTED: %s exited on its own (%s); restarting it; see %s.log", sl.name, p.Status(), sl.name)
				if err := sl.startLocked(ctx, nil); err != nil {
					s.logf("restart %s: %v", sl.name, err)
				}
			}
			sl.mu.Unlock()
		}
	}
}

// stubProc is the provider stub's process.
type stubProc struct {
	*proc.Process
	url string
}

// startStub starts the smsstub binary on a free port and reads its URL from
// the line it prints once listening. At a provider without idempotency it
// ignores keys; with lookups it also sends signed receipts, some twice and
// some followed by an older one, 0.2 to 1.2 s after acceptance (at Twilio,
// after the message left the queue, 2 s after it was taken: a lookup
// after the settle time finds it queued, without date_sent, at the end of
// the number's list). With twilioSID it serves the Twilio facade for that
// account, apiKey its auth token.
func startStub(ctx context.Context, binDir, logDir, apiKey, provider, twilioSID string) (*stubProc, error) {
	args := []string{"-addr", "127.0.0.1:0"}
	env := []string{"SMS_API_KEY=" + apiKey}
	if provider != providerIdempotent && provider != providerPair {
		args = append(args, "-ignore-keys")
	}
	if provider == providerLookup || provider == providerTwilio || provider == providerFailover {
		args = append(args, "-undelivered-suffixes", undeliveredSuffix, "-receipt-delay", "200ms", "-receipt-jitter", "1s",
			"-receipt-duplicate-rate", "0.05", "-receipt-reorder-rate", "0.05")
		env = append(env, "SMS_WEBHOOK_SECRET="+receiptSecret)
	}
	if twilioSID != "" {
		args = append(args, "-twilio-account-sid", twilioSID, "-twilio-queue-for", "2s")
		env = append(env, "TWILIO_AUTH_TOKEN="+apiKey)
	}
	p, err := proc.Start(proc.Spec{Name: "smsstub", Path: filepath.Join(binDir, "smsstub"), Args: args,
		Env: env, LogFile: filepath.Join(logDir, "smsstub.log"), Group: true})
	if err != nil {
		return nil, err
	}
	url, err := p.Announced(ctx, smsstub.Announcement, 10*time.Second)
	if err != nil {
		p.Stop(syscall.SIGTERM, 15*time.Second)
		return nil, fmt.Errorf("%w; see smsstub.log", err)
	}
	return &stubProc{Process: p, url: url}, nil
}

// stop ends the stub with SIGTERM, SIGKILL after 15s.
func (sp *stubProc) stop() { sp.Stop(syscall.SIGTERM, 15*time.Second) }

// appendFile appends text to the file at path, creating it if missing.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
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
