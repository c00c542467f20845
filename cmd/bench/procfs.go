package main

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of CPU times in /proc; 100
// on every Linux architecture Go supports.
const clockTicks = 100

// cpuSample is the CPU time used so far by each group of processes.
type cpuSample struct {
	at time.Time
	// ticks per group: relay, sender, smsstub, nats (children of the bench),
	// postgres (every process named postgres: server, backends, WAL writer,
	// checkpointer) and bench (this process).
	ticks map[string]int64
	// busy and total are the machine's CPU ticks (all cores) from /proc/stat.
	busy, total int64
}

// sampleCPU reads the CPU times of the bench's children, of Postgres and of
// the bench itself. A process that cannot be read counts as zero.
func (b *bench) sampleCPU() cpuSample {
	s := cpuSample{at: time.Now(), ticks: map[string]int64{}}
	for _, p := range b.procs {
		if t, err := procTicks(strconv.Itoa(p.Pid())); err == nil {
			s.ticks[p.role] += t
		}
	}
	if t, err := procTicks("self"); err == nil {
		s.ticks["bench"] = t
	}
	s.ticks["postgres"] = postgresTicks(b.dbName)
	s.busy, s.total = machineTicks()
	return s
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
	for k, v := range s.ticks {
		out.Cores[k] = float64(v-start.ticks[k]) / clockTicks / secs
		known += out.Cores[k]
	}
	if dt := s.total - start.total; dt > 0 {
		out.MachineBusy = float64(s.busy-start.busy) / float64(dt)
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

// procTicks returns utime+stime of /proc/<pid>/stat.
func procTicks(pid string) (int64, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may contain spaces: fields
	// are counted after the last ')'. utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: malformed", pid)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: malformed", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%s/stat: malformed", pid)
	}
	return u + s, nil
}

// postgresTicks sums the CPU times of the Postgres server's processes:
// the postmaster, its shared workers (WAL writer, checkpointer, ...) and the
// backends connected to database db; backends of other databases belong to
// someone else. A backend that exits between two samples loses its time;
// the relay's and senders' connections live as long as they do.
func postgresTicks(db string) int64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var sum int64
	for _, e := range ents {
		name := e.Name()
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", name, "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", name, "cmdline"))
		if err != nil {
			continue
		}
		if other, ok := backendDatabase(string(cmdline)); ok && other != db {
			continue
		}
		if t, err := procTicks(name); err == nil {
			sum += t
		}
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

// machineTicks returns the busy and total ticks of all cores.
func machineTicks() (busy, total int64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0
	}
	for i, v := range fields[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i < 8 { // user nice system idle iowait irq softirq steal; guest is in user
			total += n
			if i != 3 && i != 4 {
				busy += n
			}
		}
	}
	return busy, total
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
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmHWM":
			m.PeakMB = kb / 1024
		case "VmRSS":
			m.NowMB = kb / 1024
		}
	}
	if m.PeakMB == 0 {
		return m, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
	}
	return m, nil
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
