package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// durations is a sample of latencies.
type durations []time.Duration

// pct returns the p-th percentile (0..100), nearest rank; 0 when empty.
func (d durations) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// ms formats a duration in milliseconds with two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// ratio formats a/b as "×1.23"; "-" when b is zero.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("×%.2f", a/b)
}

func ratioD(a, b time.Duration) string { return ratio(float64(a), float64(b)) }

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssBytes reads VmRSS of a process (pid 0: this one) from /proc.
func rssBytes(pid int) int64 {
	path := "/proc/self/status"
	if pid > 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// procCPU is a process's user+system CPU time from /proc/PID/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz
}

func mib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// table prints a Markdown table.
type table struct {
	head []string
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) String() string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(t.head, " | ") + " |\n|")
	for range t.head {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, r := range t.rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	return b.String()
}

// perClaim is cpu divided by n claims, in milliseconds.
func perClaim(cpu time.Duration, n int) string {
	if n == 0 {
		return ""
	}
	return ms(cpu / time.Duration(n))
}

// startProfile starts a CPU profile into path ("" for none) and returns
// what stops it. A profile that cannot start is reported and skipped.
func startProfile(path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		progress("CPU profile %s: %v", path, err)
		if f != nil {
			_ = f.Close()
		}
		return func() {}
	}
	// What the test allocated: the allocation profiles at its start and
	// end (go tool pprof -sample_index=alloc_space -base FILE.allocs-start
	// BINARY FILE.allocs); the garbage collector's share of the CPU
	// profile follows from them.
	write := func(name, profile string) {
		if w, err := os.Create(name); err == nil {
			_ = pprof.Lookup(profile).WriteTo(w, 0)
			_ = w.Close()
		}
	}
	writeAllocs := func(name string) {
		runtime.GC() // the profile is as of the last collection
		write(name, "allocs")
	}
	writeAllocs(path + ".allocs-start")
	// Where the test's goroutines waited for a lock (go tool pprof
	// BINARY FILE.mutex): one contention event in mutexSample is
	// recorded, with its delay scaled back up.
	const mutexSample = 5
	runtime.SetMutexProfileFraction(mutexSample)
	// Where they waited for anything else (channels, selects, a
	// condition): every wait of a microsecond or more is sampled, so
	// the profile says where a claim's time goes off the CPU (go tool
	// pprof -focus to keep the claim path apart from idle loops).
	runtime.SetBlockProfileRate(int(time.Microsecond))
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		writeAllocs(path + ".allocs")
		write(path+".mutex", "mutex")
		write(path+".block", "block")
		runtime.SetMutexProfileFraction(0)
		runtime.SetBlockProfileRate(0)
	}
}
