package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/pki"
)

// profiles is the mix of simulated servers, assigned round robin: 23 usable
// GPUs per five servers (the "mixed" profile refuses one L40S that shares
// its IOMMU group with a host NVMe drive).
var profiles = []string{"dgx-h100", "a100-pcie-4", "l40s-4", "rtx6000pro-2", "mixed"}

// counters are what the bench's Recorder sees from every agent.
type counters struct {
	reserveFailed atomic.Int64 // owner answered a reservation with an error (not_available)
	reserved      atomic.Int64
	committed     atomic.Int64
	claimsDone    atomic.Int64
	// how coordinators looked claim IDs up (the name registry counts as
	// the directory: one answer, no every-server search)
	viaDirectory, viaEveryServer atomic.Int64
}

// recorder implements agent.Recorder for every in-process agent.
type recorder struct{ c *counters }

func (r recorder) ClaimDone(string, time.Duration) { r.c.claimsDone.Add(1) }
func (r recorder) ClaimLookup(path string) {
	if path == "directory" || path == "local" || path == "registry" {
		r.c.viaDirectory.Add(1)
	} else {
		r.c.viaEveryServer.Add(1)
	}
}
func (r recorder) Reservation(outcome string) {
	switch outcome {
	case "failed":
		r.c.reserveFailed.Add(1)
	case "reserved":
		r.c.reserved.Add(1)
	case "committed":
		r.c.committed.Add(1)
	}
}
func (recorder) VFIOOperation(string, time.Duration, error) {}
func (recorder) XID(string, string, uint64)                 {}

// node is one in-process agent.
type node struct {
	name     string
	profile  string
	a        *agent.Agent
	peerAddr string
	gossip   string
	cancel   context.CancelFunc
	done     chan error
}

// cluster is N agents on loopback: real memberlist (LAN timings), real
// HTTPS with mutual TLS between them, a real bbolt ledger with fsync each.
type cluster struct {
	dir   string
	caDir string
	nodes []*node
	by    map[string]*node
	ctr   *counters
	log   *slog.Logger
}

// freePort finds a port free for both TCP and UDP on 127.0.0.1 (memberlist
// needs both; the peer API only TCP). Another process may take it before
// the agent binds; startAgent retries then.
func freePort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port")
}

func newCluster(dir string, ctr *counters, log *slog.Logger) (*cluster, error) {
	c := &cluster{dir: dir, caDir: filepath.Join(dir, "ca"), by: map[string]*node{}, ctr: ctr, log: log}
	if err := pki.CreateCA(c.caDir, "gpuherd-bench CA", 24*time.Hour); err != nil {
		return nil, err
	}
	return c, nil
}

// issue writes a certificate for name.
func (c *cluster) issue(name string) (pki.Files, error) {
	certDir := filepath.Join(c.dir, "certs")
	if err := pki.IssueCert(c.caDir, certDir, name, []string{"127.0.0.1"}, 12*time.Hour); err != nil {
		return pki.Files{}, err
	}
	return pki.Files{CA: filepath.Join(c.caDir, "ca.crt"), Cert: filepath.Join(certDir, name+".crt"), Key: filepath.Join(certDir, name+".key")}, nil
}

// config is the configuration of agent name; seed is a gossip address to join.
func (c *cluster) config(name, profile string, files pki.Files, gport, pport int, seed string) agent.Config {
	cfg := agent.DefaultConfig()
	cfg.NodeName = name
	cfg.DataDir = filepath.Join(c.dir, name)
	cfg.Socket = filepath.Join(c.dir, name+".sock")
	cfg.Simulate = profile
	cfg.IdleDriver = "vfio-pci" // the default: free GPUs stay on vfio-pci
	cfg.NVML = "off"
	cfg.LogLevel = "warn"
	cfg.GossipAddr = "127.0.0.1:" + strconv.Itoa(gport)
	cfg.AdvertiseAddr = "127.0.0.1"
	cfg.PeerAddr = "127.0.0.1:" + strconv.Itoa(pport)
	cfg.InsecureGossip = true
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = files.CA, files.Cert, files.Key
	if seed != "" {
		cfg.Join = []string{seed}
	}
	return cfg
}

// start starts n more agents, par at a time, joined to the first one.
func (c *cluster) start(n, par int) error {
	first := len(c.nodes)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, par)
	)
	if first == 0 { // the seed alone first
		if err := c.startOne(0); err != nil {
			return err
		}
		first, n = 1, n-1
	}
	for i := first; i < first+n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := c.startOne(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	slices.SortFunc(c.nodes, func(x, y *node) int { return cmpName(x.name, y.name) })
	return nil
}

func cmpName(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (c *cluster) startOne(i int) error {
	name := fmt.Sprintf("gpu%03d", i)
	profile := profiles[i%len(profiles)]
	files, err := c.issue(name)
	if err != nil {
		return err
	}
	seed := ""
	if i > 0 {
		seed = c.nodes0().gossip
	}
	var last error
	for range 5 {
		gport, err := freePort()
		if err != nil {
			return err
		}
		pport, err := freePort()
		if err != nil {
			return err
		}
		cfg := c.config(name, profile, files, gport, pport, seed)
		a, err := agent.New(context.Background(), cfg, c.log.With("node", name), agent.WithRecorder(recorder{c.ctr}))
		if err != nil {
			last = err
			_ = os.RemoveAll(cfg.DataDir)
			continue
		}
		cancel, done, err := runAgent(a)
		if err != nil {
			last = err
			_ = os.RemoveAll(cfg.DataDir)
			continue
		}
		nd := &node{name: name, profile: profile, a: a, peerAddr: cfg.PeerAddr, gossip: cfg.GossipAddr, cancel: cancel, done: done}
		c.add(nd)
		return nil
	}
	return fmt.Errorf("starting %s: %w", name, last)
}

// runAgent runs a until it is ready and returns how to stop it and where
// Run's end is reported; an agent that fails to start is closed and its
// error returned.
func runAgent(a *agent.Agent) (context.CancelFunc, chan error, error) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
		return cancel, done, nil
	case err := <-done:
		cancel()
		a.Close()
		return nil, nil, err
	}
}

var clusterMu sync.Mutex

func (c *cluster) add(nd *node) {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	c.nodes = append(c.nodes, nd)
	c.by[nd.name] = nd
}

func (c *cluster) nodes0() *node {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	return c.by["gpu000"]
}

// converged reports whether every agent sees every other alive with a
// readable summary.
func (c *cluster) converged() bool {
	for _, nd := range c.nodes {
		ms, _ := nd.a.Members(context.Background())
		alive := 0
		for _, m := range ms {
			if m.State == "alive" && len(m.Models) > 0 {
				alive++
			}
		}
		if alive < len(c.nodes) {
			return false
		}
	}
	return true
}

// waitConverged polls until converged or the deadline.
func (c *cluster) waitConverged(limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for !c.converged() {
		if time.Since(start) > limit {
			return time.Since(start), fmt.Errorf("%d agents did not converge within %v", len(c.nodes), limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start), nil
}

// stop stops every agent (graceful leave), in parallel.
func (c *cluster) stop() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, nd := range c.nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nd.cancel()
			<-nd.done
			nd.a.Close()
		}()
	}
	wg.Wait()
	c.nodes = nil
	c.by = map[string]*node{}
}

// capacity is each server's GPUs per model, from its own ledger.
type capacity map[string]map[string]int

// capacity is what each server can hand out per model: its healthy GPUs
// that can be passed through, from its own ledger.
func (c *cluster) capacity() capacity {
	out := capacity{}
	for _, nd := range c.nodes {
		ms, _ := nd.a.Members(context.Background())
		for _, m := range ms {
			if m.Self {
				out[nd.name] = usable(m)
			}
		}
	}
	return out
}

// truthFree is what every server has free right now, read from each
// owner's ledger (reservations in flight count as taken).
func (c *cluster) truthFree() capacity {
	out := capacity{}
	for _, nd := range c.nodes {
		// The owner's own ledger read (what GET capacity answers), not
		// the members list: it is read after every grant of a replay.
		capa, err := nd.a.Capacity(context.Background())
		if err == nil {
			out[nd.name] = capa.Free
		}
	}
	return out
}

// usable is what member m can hand out per model: its healthy GPUs that
// can be passed through, not its total. A GPU that cannot (the mixed
// profile's L40S that shares its IOMMU group with a host NVMe drive) is
// no capacity for the oracle or the etcd allocator either: counted, it
// gave them ten L40S the agents never had.
func usable(m api.Member) map[string]int {
	out := map[string]int{}
	for _, x := range m.Models {
		out[x.Model] = x.Healthy
	}
	return out
}
