package main

import (
	"cmp"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// cpuSample is the CPU time used so far by each group of processes.
type cpuSample struct {
	at time.Time
	// secs per group: relay, sender, smsstub, nats (children of the bench),
	// postgres (every process named postgres: server, backends, WAL writer,
	// checkpointer) and bench (this process), in CPU seconds.
	secs map[string]float64
	// busy and total are the machine's CPU seconds (all cores).
	busy, total float64
}

// sampleCPU reads the CPU times of the bench's children, of Postgres and of
// the bench itself. A process that cannot be read counts as zero.
func (b *bench) sampleCPU() cpuSample {
	s := cpuSample{at: time.Now(), secs: map[string]float64{}}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return s
	}
	for _, p := range b.procs {
		if proc, err := fs.Proc(p.Pid()); err == nil {
			s.secs[p.role] += cpuSeconds(proc)
		}
	}
	if self, err := fs.Self(); err == nil {
		s.secs["bench"] = cpuSeconds(self)
	}
	s.secs["postgres"] = postgresSeconds(fs, b.dbName)
	if st, err := fs.Stat(); err == nil {
		c := st.CPUTotal // guest time is inside user
		s.busy = c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
		s.total = s.busy + c.Idle + c.Iowait
	}
	return s
}

// cpuSeconds returns a process's user plus system time; 0 if it cannot be
// read.
func cpuSeconds(p procfs.Proc) float64 {
	st, err := p.Stat()
	if err != nil {
		return 0
	}
	return st.CPUTime()
}

// cpuSplit is the CPU used between two samples, in cores (1.0 = one core
// busy the whole time), by group.
type cpuSplit struct {
	// Seconds is the length of the measured window.
	Seconds float64 `json:"window_seconds"`
	// Cores is the CPU used per group, in cores: relay, sender, smsstub,
	// nats, postgres, bench, and other (the rest of the busy time).
	Cores map[string]float64 `json:"cores"`
	// MachineBusy is the share of all cores busy over the window, 0..1.
	MachineBusy float64 `json:"machine_busy"`
}

func (s cpuSample) since(start cpuSample) cpuSplit {
	secs := s.at.Sub(start.at).Seconds()
	out := cpuSplit{Seconds: secs, Cores: map[string]float64{}}
	if secs <= 0 {
		return out
	}
	known := 0.0
	for k, v := range s.secs {
		out.Cores[k] = (v - start.secs[k]) / secs
		known += out.Cores[k]
	}
	if dt := s.total - start.total; dt > 0 {
		out.MachineBusy = (s.busy - start.busy) / dt
		// Whatever else kept the cores busy: other programs (a test suite
		// running meanwhile skews every figure), Postgres backends of other
		// databases, the kernel's interrupt work.
		out.Cores["other"] = max(0, out.MachineBusy*float64(runtime.NumCPU())-known)
	}
	return out
}

// String lists the groups by CPU used, largest first.
func (c cpuSplit) String() string {
	keys := slices.Collect(maps.Keys(c.Cores))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(c.Cores[b], c.Cores[a]) })
	var sb strings.Builder
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s %.2f", k, c.Cores[k])
	}
	fmt.Fprintf(&sb, " cores; machine %.0f%% busy over %.1fs", 100*c.MachineBusy, c.Seconds)
	return sb.String()
}

// postgresSeconds sums the CPU times of the Postgres server's processes:
// the postmaster, its shared workers (WAL writer, checkpointer, ...) and the
// backends connected to database db; backends of other databases belong to
// someone else. A backend that exits between two samples loses its time;
// the relay's and senders' connections live as long as they do.
func postgresSeconds(fs procfs.FS, db string) float64 {
	procs, err := fs.AllProcs()
	if err != nil {
		return 0
	}
	var sum float64
	for _, p := range procs {
		if comm, err := p.Comm(); err != nil || comm != "postgres" {
			continue
		}
		cmdline, err := p.CmdLine()
		if err != nil {
			continue
		}
		if other, ok := backendDatabase(strings.Join(cmdline, " ")); ok && other != db {
			continue
		}
		sum += cpuSeconds(p)
	}
	return sum
}

// backendDatabase returns the database of a Postgres backend from its
// process title, "postgres: [cluster: ]user database host(port) state";
// ok is false for the postmaster and the shared workers.
func backendDatabase(title string) (db string, ok bool) {
	f := strings.Fields(strings.ReplaceAll(title, "\x00", " "))
	if len(f) == 0 || f[0] != "postgres:" {
		return "", false
	}
	for i := 2; i < len(f); i++ {
		if f[i] == "[local]" || (strings.HasSuffix(f[i], ")") && strings.Contains(f[i], "(")) {
			return f[i-1], true
		}
	}
	return "", false
}

// memory is a process's resident set, in MiB.
type memory struct {
	// PeakMB is VmHWM, the largest resident set since the process started.
	PeakMB float64 `json:"peak_mb"`
	// NowMB is VmRSS when read.
	NowMB float64 `json:"now_mb"`
}

// readMemory reads VmHWM and VmRSS of pid.
func readMemory(pid int) (memory, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return memory{}, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return memory{}, err
	}
	if st.VmHWM == 0 {
		return memory{}, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
	}
	return memory{PeakMB: float64(st.VmHWM) / (1 << 20), NowMB: float64(st.VmRSS) / (1 << 20)}, nil
}

// memories reads every running child's memory, by process name.
func (b *bench) memories() map[string]memory {
	out := map[string]memory{}
	for _, p := range b.procs {
		if m, err := readMemory(p.Pid()); err == nil {
			out[p.Name()] = m
		}
	}
	return out
}
