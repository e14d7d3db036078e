package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
	"go.yaml.in/yaml/v3"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/gossip"
)

// childStatsEnv names a file the child writes its memory breakdown to (and
// a heap profile beside it, FILE.heap) each time it gets SIGUSR1.
const childStatsEnv = "GPUHERD_BENCH_CHILD_STATS"

// childStats is where one agent's memory goes, by the runtime's classes
// and the kernel's (anonymous memory against file pages: the binary's
// text and data that are mapped in).
type childStats struct {
	RSS, RSSAnon, RSSFile           int64
	HeapObjects, HeapFree, HeapIdle uint64 // live and dead objects; free spans not yet returned; returned
	Stacks, Metadata, Other         uint64
	Total                           uint64 // all the runtime mapped
	Goroutines                      uint64
	GCGoal                          uint64
}

// serveChildStats answers SIGUSR1 with the stats file, in the child.
func serveChildStats(path string) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			runtime.GC()
			s := readChildStats()
			b, _ := json.Marshal(s)
			_ = os.WriteFile(path+".tmp", b, 0o600)
			if f, err := os.Create(path + ".heap"); err == nil {
				_ = pprof.WriteHeapProfile(f)
				f.Close()
			}
			_ = os.Rename(path+".tmp", path)
		}
	}()
}

func readChildStats() childStats {
	names := []string{
		"/memory/classes/heap/objects:bytes", "/memory/classes/heap/free:bytes", "/memory/classes/heap/released:bytes",
		"/memory/classes/heap/unused:bytes", "/memory/classes/heap/stacks:bytes", "/memory/classes/os-stacks:bytes",
		"/memory/classes/metadata/other:bytes", "/memory/classes/metadata/mcache/inuse:bytes", "/memory/classes/metadata/mspan/inuse:bytes",
		"/memory/classes/other:bytes", "/memory/classes/profiling/buckets:bytes", "/memory/classes/total:bytes",
		"/sched/goroutines:goroutines", "/gc/heap/goal:bytes",
	}
	ss := make([]metrics.Sample, len(names))
	for i, n := range names {
		ss[i].Name = n
	}
	metrics.Read(ss)
	v := map[string]uint64{}
	for _, s := range ss {
		if s.Value.Kind() == metrics.KindUint64 {
			v[s.Name] = s.Value.Uint64()
		}
	}
	out := childStats{
		HeapObjects: v["/memory/classes/heap/objects:bytes"] + v["/memory/classes/heap/unused:bytes"],
		HeapFree:    v["/memory/classes/heap/free:bytes"],
		HeapIdle:    v["/memory/classes/heap/released:bytes"],
		Stacks:      v["/memory/classes/heap/stacks:bytes"] + v["/memory/classes/os-stacks:bytes"],
		Metadata:    v["/memory/classes/metadata/other:bytes"] + v["/memory/classes/metadata/mcache/inuse:bytes"] + v["/memory/classes/metadata/mspan/inuse:bytes"],
		Other:       v["/memory/classes/other:bytes"] + v["/memory/classes/profiling/buckets:bytes"],
		Total:       v["/memory/classes/total:bytes"],
		Goroutines:  v["/sched/goroutines:goroutines"],
		GCGoal:      v["/gc/heap/goal:bytes"],
	}
	m := procMemory(0)
	out.RSS, out.RSSAnon, out.RSSFile = m.RSS, m.RSSAnon, m.RSSFile
	return out
}

// procMemory is a process's RSS, anonymous and file-backed, from /proc
// (pid 0: this one).
func procMemory(pid int) childStats {
	var out childStats
	path := "/proc/self/status"
	if pid > 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	if b, err := os.ReadFile(path); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "VmRSS:":
				out.RSS = kb * 1024
			case "RssAnon:":
				out.RSSAnon = kb * 1024
			case "RssFile:":
				out.RSSFile = kb * 1024
			}
		}
	}
	return out
}

// childScale is one agent in a process of its own joined to a cluster of
// lightweight gossip members.
type childScale struct {
	n       int           // members besides the child
	formed  time.Duration // until the light members had all joined
	seen    time.Duration // until the child listed every member alive
	env     []string
	cpu     time.Duration
	win     time.Duration
	stats   childStats
	heapOut string // the child's heap profile, copied here
	bin     string // the binary it ran
	err     error
}

// childBin, when set (-child-bin), is the gpuherd binary the agent of
// runChildScale runs, instead of this program re-executed.
var childBin string

// runChildScale starts n gossip.Cluster members (real memberlist, real UDP
// and TCP on 127.0.0.1) in this process, in waves, then one full agent
// (dgx-h100) in a process of its own joined to them, and measures that
// agent idle: RSS, CPU, and where its memory goes. The agent keeps the
// LAN timings. The members are quiet (quietTimers): they answer the
// agent's probes, gossip and push/pulls at once, but probe and gossip
// nothing themselves, and each joins through the first member, which
// the agent joins through too and learns every member from. Two cores
// cannot run 1,000 memberlists that gossip with each other at LAN timings
// (convergeMock; with timers stretched ×10 the bench stalled past 900),
// and what the agent holds per member does not depend on what the members
// say to each other; what it receives per second is lower than in a
// real cluster, where every member also gossips to it.
func runChildScale(c *cluster, n int, envs [][]string, idle time.Duration, out string) []childScale {
	var rs []childScale
	cs := make([]*gossip.Cluster, 0, n)
	defer func() {
		for _, m := range cs {
			_ = m.Shutdown()
		}
	}()
	start := time.Now()
	for lo := 0; lo < n; lo += joinWave {
		hi := min(lo+joinWave, n)
		for i := lo; i < hi; i++ {
			s := benchSummary(8)
			// The agent may call a member's peer API: a closed port on
			// loopback answers at once, and nothing leaves the machine.
			s.PeerAddr = "127.0.0.1:9"
			// Members of a registry, as in a real cluster, where one
			// exists: otherwise the agent, finding none, would ask every
			// member whether it knows one before founding it, again and
			// again, and measure that.
			s.Names = gossip.NamesInfo{Role: gossip.NamesClient, Registry: "bench-light"}
			cfg := gossip.Config{NodeName: fmt.Sprintf("light%04d", i), BindAddr: "127.0.0.1", AdvertiseAddr: "127.0.0.1", Insecure: true, Log: mockLog,
				Tune: quietTimers}
			if i > 0 {
				cfg.Join = []string{cs[0].LocalAddr()}
			}
			m, err := gossip.New(cfg, func() gossip.Summary { return s })
			if err != nil {
				return []childScale{{n: n, err: err}}
			}
			cs = append(cs, m)
			if i > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_ = m.Join(ctx)
				cancel()
			}
		}
		// The first member, which every other joined through, knows them all.
		for w0 := time.Now(); time.Since(w0) < time.Minute; time.Sleep(250 * time.Millisecond) {
			alive := 0
			for _, x := range cs[0].Members() {
				if x.State == gossip.StateAlive {
					alive++
				}
			}
			if alive >= hi {
				break
			}
		}
		progress("  %d gossip members on loopback, after %v", hi, time.Since(start).Round(time.Millisecond))
	}
	formed := time.Since(start)
	for k, env := range envs {
		progress("  the agent in its own process, environment %q", strings.Join(env, " "))
		r := childIn(c, cs, fmt.Sprintf("gpu%d", 9000+k), env, idle, out)
		r.n, r.formed = n, formed
		rs = append(rs, r)
	}
	return rs
}

// childIn starts one agent in its own process joined to cs and measures it.
func childIn(c *cluster, cs []*gossip.Cluster, name string, env []string, idle time.Duration, out string) childScale {
	n := len(cs)
	res := childScale{env: env}
	files, err := c.issue(name)
	if err != nil {
		res.err = err
		return res
	}
	gport, err1 := freePort()
	pport, err2 := freePort()
	if err1 != nil || err2 != nil {
		res.err = fmt.Errorf("no free port: %v %v", err1, err2)
		return res
	}
	cfg := c.config(name, "dgx-h100", files, gport, pport, cs[0].LocalAddr())
	statsPath := filepath.Join(c.dir, name+"-stats.json")
	var cmd *exec.Cmd
	if childBin != "" {
		// The real binary, configured as an operator would: a YAML file.
		y, err := yaml.Marshal(cfg)
		if err == nil {
			err = os.WriteFile(filepath.Join(c.dir, name+".yaml"), y, 0o600)
		}
		if err != nil {
			res.err = err
			return res
		}
		cmd = exec.Command(childBin, "agent", "--config", filepath.Join(c.dir, name+".yaml"))
		cmd.Env = append(os.Environ(), env...)
	} else {
		spec, _ := json.Marshal(cfg)
		exe, err := os.Executable()
		if err != nil {
			res.err = err
			return res
		}
		cmd = exec.Command(exe)
		cmd.Env = append(append(os.Environ(), childEnv+"="+string(spec), childStatsEnv+"="+statsPath), env...)
	}
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		res.err = err
		return res
	}
	ch := &childAgent{cmd: cmd, socket: cfg.Socket, name: name}
	defer ch.stop()
	cli := api.NewClient(cfg.Socket)
	defer cli.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ms, err := cli.Members(ctx)
		cancel()
		alive := 0
		for _, m := range ms {
			if m.State == "alive" {
				alive++
			}
		}
		if err == nil && alive >= n+1 {
			break
		}
		if time.Since(t0) > 5*time.Minute {
			res.err = fmt.Errorf("the agent listed %d of %d members alive after %v", alive, n+1, time.Since(t0).Round(time.Second))
			return res
		}
		time.Sleep(500 * time.Millisecond)
	}
	res.seen = time.Since(t0)
	progress("  the agent in its own process lists all %d members alive after %v", n+1, res.seen.Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	pid := cmd.Process.Pid
	c0, w := procCPU(pid), time.Now()
	time.Sleep(idle)
	res.cpu, res.win = procCPU(pid)-c0, time.Since(w)
	res.bin = cmd.Path
	if childBin != "" {
		// No runtime breakdown from the real binary: the kernel's alone.
		res.stats = procMemory(pid)
		return res
	}
	_ = os.Remove(statsPath)
	_ = cmd.Process.Signal(syscall.SIGUSR1)
	for t := time.Now(); time.Since(t) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile(statsPath); err == nil {
			_ = json.Unmarshal(b, &res.stats)
			break
		}
	}
	if out != "" {
		if b, err := os.ReadFile(statsPath + ".heap"); err == nil {
			res.heapOut = filepath.Join(out, fmt.Sprintf("agent-heap-%d-%s.pprof", n, name))
			_ = os.WriteFile(res.heapOut, b, 0o644)
		}
	}
	return res
}

func reportChildScale(w io.Writer, rs []childScale) {
	if len(rs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## One agent in its own process in a large cluster\n\n")
	p("A full agent (dgx-h100, simulated hardware) re-executed from this binary, joined over real loopback UDP/TCP to gossip.Cluster members in the bench process (real memberlist; they answer the agent at once but probe and gossip nothing themselves; the agent keeps LAN timings); measured idle, after it listed every member alive. RSS split by the kernel into anonymous memory and file pages (the binary's mapped text and data); the rest by the Go runtime's memory classes, after a GC.\n\n")
	t := table{head: []string{"members", "environment", "lists all after", "RSS MiB", "anonymous MiB", "file MiB", "heap objects MiB", "heap free MiB", "stacks MiB", "runtime metadata + other MiB", "goroutines", "idle CPU"}}
	for _, r := range rs {
		env := "defaults"
		if len(r.env) > 0 {
			env = strings.Join(r.env, " ")
		}
		if childBin != "" {
			env = filepath.Base(childBin) + " agent, " + env
		}
		if r.err != nil {
			t.add(fmt.Sprint(r.n+1), env, "error: "+r.err.Error(), "", "", "", "", "", "", "", "", "")
			continue
		}
		s := r.stats
		cpu := "-"
		if r.win > 0 {
			cpu = fmt.Sprintf("%.2f%% of a core", 100*r.cpu.Seconds()/r.win.Seconds())
		}
		t.add(fmt.Sprint(r.n+1), env, r.seen.Round(time.Millisecond).String(), mib(s.RSS), mib(s.RSSAnon), mib(s.RSSFile),
			mib(int64(s.HeapObjects)), mib(int64(s.HeapFree)), mib(int64(s.Stacks)), mib(int64(s.Metadata+s.Other)), fmt.Sprint(s.Goroutines), cpu)
	}
	p("%s\n", t.String())
}

// quietTimers makes a member that answers and never asks: no probes (an
// hour apart), no gossip to others, no periodic push/pull.
func quietTimers(mc *memberlist.Config) {
	mc.ProbeInterval = time.Hour
	mc.GossipNodes = 0
	mc.PushPullInterval = 0
}
