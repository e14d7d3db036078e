package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claimtest"
	"github.com/gpuherd/gpuherd/agent/internal/testmain"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/gossip/gossiptest"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Who may talk to the agent, and what the agent may touch.
//
// Gossip without the cluster's key, or with another key, never joins:
// gossip.TestClusterEncrypted (wrong key, no key) and
// gossip.TestClusterWithoutKeyRefusesToStart cover it with real memberlist
// on loopback.

// TestIntegrationPeerListenerRefusesClientsWithoutOurCertificate dials a real agent's
// mutual-TLS peer listener with clients that have no certificate, one from
// another CA, or plain HTTP: none gets an answer, none changes anything.
// A client with a certificate of the cluster's CA is the control.
func TestIntegrationPeerListenerRefusesClientsWithoutOurCertificate(t *testing.T) {
	tc := newSocketCluster(t)
	a := tc.start("owner", "l40s-4")
	addr := a.cluster.peerAddr
	caDir := filepath.Join(tc.dir, "ca")
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(caDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)

	// Another CA, with a certificate that even names a node of ours.
	other := t.TempDir()
	if err := pki.CreateCA(filepath.Join(other, "ca"), "intruder CA", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := pki.IssueCert(filepath.Join(other, "ca"), filepath.Join(other, "certs"), "owner", []string{"127.0.0.1"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.LoadX509KeyPair(filepath.Join(other, "certs", "owner.crt"), filepath.Join(other, "certs", "owner.key"))
	if err != nil {
		t.Fatal(err)
	}
	// Ours: a client certificate of the cluster's CA.
	if err := pki.IssueCert(caDir, filepath.Join(tc.dir, "certs"), "client-1", []string{"127.0.0.1"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	ours, err := tls.LoadX509KeyPair(filepath.Join(tc.dir, "certs", "client-1.crt"), filepath.Join(tc.dir, "certs", "client-1.key"))
	if err != nil {
		t.Fatal(err)
	}

	client := func(certs []tls.Certificate) *http.Client {
		cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, ServerName: "127.0.0.1"}
		if len(certs) > 0 {
			// Present it whatever CAs the server asks for: Go's client
			// would otherwise keep a foreign certificate to itself.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
		}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	rev, writes := a.ledger.Revision(), len(a.sim.Kernel.Writes())
	claim := `{"gpus":[{"model":"L40S","count":1}]}`
	put := func(c *http.Client, scheme string) (*http.Response, error) {
		req, _ := http.NewRequest("PUT", scheme+"://"+addr+"/v1/claims/vm-intruder", strings.NewReader(claim))
		req.Header.Set("Content-Type", "application/json")
		return c.Do(req)
	}
	for _, tt := range []struct {
		name   string
		client *http.Client
		scheme string
	}{
		{"no certificate", client(nil), "https"},
		{"certificate of another CA", client([]tls.Certificate{foreign}), "https"},
		{"plain HTTP", &http.Client{Timeout: 5 * time.Second}, "http"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := put(tt.client, tt.scheme)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode < 400 {
					t.Fatalf("served: %d %s", resp.StatusCode, body)
				}
				if tt.scheme != "http" {
					t.Fatalf("answered over TLS without a valid client certificate: %d %s", resp.StatusCode, body)
				}
				return // Go's TLS server answers plain HTTP with a 400 and nothing else
			}
			var ue interface{ Timeout() bool }
			if errors.As(err, &ue) && ue.Timeout() {
				t.Fatalf("the listener hung instead of refusing: %v", err)
			}
		})
	}
	if a.ledger.Revision() != rev || len(a.sim.Kernel.Writes()) != writes {
		t.Fatal("a refused client changed the ledger or the machine")
	}
	if _, err := a.Get(context.Background(), "vm-intruder"); err == nil {
		t.Fatal("vm-intruder exists")
	}

	// The control: the same request with a certificate of our CA is served.
	resp, err := put(client([]tls.Certificate{ours}), "https")
	if err != nil {
		t.Fatalf("a client of the cluster's CA: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a client of the cluster's CA: %d %s", resp.StatusCode, body)
	}

	// A certificate of our CA speaks for its own node only: a peer call
	// naming another coordinator is refused, whatever the CA.
	rev = a.ledger.Revision()
	req, _ := http.NewRequest("PUT", "https://"+addr+"/v1/peer/reservations/vm-posed",
		strings.NewReader(`{"items":[{"model":"NVIDIA L40S","count":1}],"coordinator":"owner"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err = client([]tls.Certificate{ours}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), `"forbidden"`) || !strings.Contains(string(body), "client-1") {
		t.Fatalf("client-1 reserving as the owner: %d %s", resp.StatusCode, body)
	}
	if a.ledger.Revision() != rev {
		t.Fatal("a refused peer call changed the ledger")
	}
}

// socketChildEnv makes the test binary, run again as another user, only
// dial the socket it names and report how that went.
const socketChildEnv = "GPUHERD_TEST_DIAL_SOCKET"

func TestMain(m *testing.M) {
	if path := os.Getenv(socketChildEnv); path != "" {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			fmt.Println("connected")
			os.Exit(0)
		}
		fmt.Println(err)
		if errors.Is(err, syscall.EACCES) {
			os.Exit(13)
		}
		os.Exit(1)
	}
	registriesFormFast()
	os.Exit(testmain.Run(m, clusterParallel()))
}

// TestSocketRefusesOtherUsers runs the test binary again as nobody
// (65534) against a real agent's socket, in a directory everyone may
// enter, so that only the socket's own mode (0660, root's group) stands in
// the way: the connect must fail with EACCES. Root is the control.
func TestSocketRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test switches to another user")
	}
	dir, err := os.MkdirTemp("", "gpuherd-socket-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A copy of this test binary that nobody may run: go's build directory is 0700.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "agent.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(t, t.TempDir())
	cfg.Socket = filepath.Join(dir, "run", "gpuherd.sock")
	m := machine(t, "l40s-4", t.TempDir())
	a := startAgent(t, cfg, m, nil)
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	<-ready
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	fi, err := os.Stat(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v, want a socket of mode 0660", fi.Mode())
	}

	run := func(uid, gid uint32) (int, string) {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), socketChildEnv+"="+cfg.Socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatalf("running the child: %v", err)
		}
		return 0, string(out)
	}
	if code, out := run(0, 0); code != 0 {
		t.Fatalf("root cannot connect (the control): exit %d: %s", code, out)
	}
	if code, out := run(65534, 65534); code != 13 {
		t.Fatalf("nobody connecting to the socket: exit %d (%s), want EACCES", code, strings.TrimSpace(out))
	}
}

// The only sysfs files the agent may write, relative to the sysfs root.
var allowedWrite = regexp.MustCompile(`^bus/pci/(devices/([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])/(driver_override|driver/unbind)|drivers_probe|drivers/[a-z0-9_-]+/(bind|unbind))$`)

// TestWritesStayOnGPUsAndTheirGroups runs claims, resizes, drains,
// releases, expiry and a restart's reconcile on every simulated profile,
// then checks every write the fake kernel saw: to an allowed file only, and
// about an NVIDIA function of a GPU's IOMMU group only. The mixed profile
// has a GPU sharing its group with an NVMe drive: that drive is never
// written, nor its GPU bound.
func TestWritesStayOnGPUsAndTheirGroups(t *testing.T) {
	for _, profile := range []string{"dgx-h100", "l40s-4", "a100-pcie-4", "rtx6000pro-2", "mixed"} {
		t.Run(profile, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(t, dir)
			m := machine(t, profile, dir)
			clock := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
			ctx := context.Background()
			a := startAgent(t, cfg, m, clock)
			st, err := a.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			model := st.GPUs[0].Model
			if _, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: model, Count: 1}}}); err != nil {
				t.Fatal(err)
			}
			_, _ = a.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: model, Count: 2}}})
			if _, err := a.Reserve(ctx, "vm-orphan", api.ReserveRequest{Items: []api.Item{{Model: model, Count: 1}}, Coordinator: "gone"}); err != nil {
				t.Logf("reserve: %v", err)
			}
			_, _ = a.Drain(ctx, st.GPUs[len(st.GPUs)-1].PCIAddress, "test")
			clock.Advance(time.Hour)
			a.Sweep(ctx)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			a = startAgent(t, cfg, m, clock) // reconcile
			if _, err := a.Release(ctx, "vm-1"); err != nil {
				t.Fatal(err)
			}
			a.Close()

			// What the agent may touch: every function of a GPU's group
			// that is NVIDIA's (the GPU, its audio and USB-C functions).
			pci := vfio.New(m.Kernel)
			allowed := map[string]bool{}
			for _, g := range st.GPUs {
				if g.IOMMUGroup < 0 {
					continue
				}
				members, err := pci.GroupMembers(g.IOMMUGroup)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range members {
					if d.Vendor == vfio.VendorNVIDIA {
						allowed[d.Address] = true
					}
				}
			}
			writes := m.Kernel.Writes()
			if len(writes) == 0 {
				t.Fatal("no writes recorded: the test checks nothing")
			}
			for _, w := range writes {
				sub := allowedWrite.FindStringSubmatch(w.Name)
				if sub == nil {
					t.Errorf("write to %q (%q): not a file the agent may write", w.Name, w.Data)
					continue
				}
				addr := sub[2] // the device directory
				if addr == "" {
					addr = w.Data // drivers_probe, bind, unbind take the address
				}
				if !allowed[addr] {
					t.Errorf("write to %q (%q) is about %q, not a GPU or an NVIDIA function of its group", w.Name, w.Data, addr)
				}
			}
			if profile == "mixed" {
				for _, g := range st.GPUs {
					if g.Health != "" && slices.ContainsFunc(writes, func(w fakekernel.Write) bool { return strings.Contains(w.Name, g.PCIAddress) || w.Data == g.PCIAddress }) {
						t.Errorf("GPU %s is refused (%s) but was written to", g.PCIAddress, g.Health)
					}
				}
			}
		})
	}
}

// A member that gossips free GPUs at a peer address that never answers
// (anyone with the gossip key can advertise one) costs a claim one
// connection attempt of about a second, not the reserve timeout, and is
// then avoided: the next claims do not call it at all. Here it is the
// best fit and the home of the claim IDs, the worst case. Before, such a
// claim took 20 s or more.
func TestClaimAvoidsAMemberWhosePeerAddressVanished(t *testing.T) {
	tc, _, _, c := threeAgents(t, 0, "l40s-4", "l40s-4", "a100-pcie-4")
	dead := tc.agents["a"]
	ctx := context.Background()
	if cl, err := dead.Claim(ctx, "vm-fill", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, PreferNode: "a", SameNode: true}); err != nil || cl.Node != "a" {
		t.Fatalf("filling a: %+v, %v", cl, err)
	}
	tc.converge("a's claim", func(x *Agent) bool {
		t, ok := targetNamed(x.targets(), "a")
		return ok && t.Caps()["NVIDIA L40S"].Free == 2
	})
	tc.peers.Vanish("a")

	claim := func(id string) (api.Claim, time.Duration) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 40*time.Second)
		defer cancel()
		start := time.Now()
		cl, err := c.Claim(cctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("claim %s after %v: %v", id, took, err)
		}
		return cl, took
	}
	// The first claim meets the dead address: best fit, and home of the ID.
	first, took := claim(idHomedOn(c, "a"))
	t.Logf("first claim with a dead peer address: %v, on %s", took, first.Node)
	if first.Node != "b" || took > 2500*time.Millisecond {
		t.Errorf("the first claim took %v (on %s); one connection attempt of %v is its price", took, first.Node, time.Second)
	}
	// The next ones do not call it at all.
	calls := tc.peers.Calls("c", "a")
	second, took := claim(idHomedOn(c, "a") + "-2")
	t.Logf("next claim: %v, on %s", took, second.Node)
	if n := tc.peers.Calls("c", "a") - calls; n != 0 || second.Node != "b" {
		t.Errorf("the next claim called the avoided member %d times, took %v, landed on %s", n, took, second.Node)
	}
	// Gets and releases of its claims say it did not answer, at once.
	start := time.Now()
	if _, err := c.Get(ctx, "vm-fill"); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "a") {
		t.Errorf("get of a claim on the avoided member: %v, want unavailable naming it", err)
	}
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("the get took %v", took)
	}
}

// An agent refuses to start when its certificate names another node:
// other agents would take its calls for that node's. It fails before any
// sysfs write, naming both names; the same start with its own
// certificate joins.
func TestStartRefusesACertificateOfAnotherNode(t *testing.T) {
	dir := t.TempDir()
	caDir, certDir := filepath.Join(dir, "ca"), filepath.Join(dir, "certs")
	if err := pki.CreateCA(caDir, "test CA", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"gpu-1", "gpu-2"} {
		if err := pki.IssueCert(caDir, certDir, n, []string{"127.0.0.1"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	start := func(cert string) (*Agent, *sim.Machine, error) {
		d := t.TempDir()
		cfg := testConfig(t, d)
		cfg.NodeName = "gpu-1"
		cfg.GossipAddr, cfg.PeerAddr, cfg.AdvertiseAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1"
		cfg.InsecureGossip = true
		cfg.TLSCA = filepath.Join(caDir, "ca.crt")
		cfg.TLSCert, cfg.TLSKey = filepath.Join(certDir, cert+".crt"), filepath.Join(certDir, cert+".key")
		m := machine(t, "l40s-4", d)
		var peers claimtest.Network
		var gossip gossiptest.Network
		tr := gossip.NewTransport()
		a, err := New(context.Background(), cfg, quietLog(), WithSysfs(m.Kernel, m.NVML), WithPeerNetwork(&peers),
			WithGossipTune(func(c *memberlist.Config) { fastGossip(c); c.Transport = tr }))
		return a, m, err
	}
	a, m, err := start("gpu-2")
	if err == nil {
		a.Close()
		t.Fatal("an agent named gpu-1 started with gpu-2's certificate")
	}
	if !strings.Contains(err.Error(), `names node "gpu-2"`) || !strings.Contains(err.Error(), `node_name is "gpu-1"`) {
		t.Errorf("the refusal does not name both nodes: %v", err)
	}
	if w := m.Kernel.Writes(); len(w) != 0 {
		t.Errorf("%d sysfs writes before the refusal", len(w))
	}
	a, _, err = start("gpu-1")
	if err != nil {
		t.Fatalf("the control, with its own certificate: %v", err)
	}
	a.Close()
}

// The same over real sockets and mutual TLS: a member's peer port accepts
// connections and never completes a TLS handshake (a tarpit, or a process
// stopped with SIGSTOP). A claim for which it is the best fit pays the
// connect bound once — before, the handshake alone could take the whole
// 20 s reserve timeout — and the next claim does not try it.
func TestIntegrationClaimAvoidsAPeerThatNeverHandshakes(t *testing.T) {
	tc := newSocketCluster(t)
	// The name registry runs on c alone: the member whose port turns into
	// a pit is an ordinary owner, as a stranger advertising GPUs would be.
	tc.adjust = func(c *Config) { c.DirectorySettle = 0; c.NamesVoters = []string{"c"} }
	tar := tc.start("a", "l40s-4")
	tc.start("b", "l40s-4")
	c := tc.start("c", "a100-pcie-4")
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 3 })
	ctx := context.Background()
	if _, err := tar.Claim(ctx, "vm-fill", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, PreferNode: "a", SameNode: true}); err != nil {
		t.Fatal(err)
	}
	tc.converge("a's claim", func(x *Agent) bool {
		t, ok := targetNamed(x.targets(), "a")
		return ok && t.Caps()["NVIDIA L40S"].Free == 2
	})
	// a's peer port now accepts and says nothing.
	addr := tar.cluster.ln.Addr().String()
	tar.cluster.ln.Close()
	pit, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("taking over a's peer port: %v", err)
	}
	defer pit.Close()
	// Connections made before (the name registry's calls) would still
	// reach a's handler: drop them, so every call to a dials the pit.
	for _, x := range []*Agent{tar, c} {
		x.cluster.mu.Lock()
		for _, pc := range x.cluster.clients {
			pc.Close()
		}
		x.cluster.mu.Unlock()
	}
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			conn, err := pit.Accept()
			if err != nil {
				return
			}
			held = append(held, conn)
		}
	}()
	claim := func(id string) time.Duration {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		start := time.Now()
		cl, err := c.Claim(cctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
		if err != nil || cl.Node != "b" {
			t.Fatalf("claim %s after %v: %+v, %v", id, time.Since(start), cl, err)
		}
		return time.Since(start)
	}
	first := claim(idHomedOn(c, "a"))
	next := claim(idHomedOn(c, "a") + "-2")
	t.Logf("claims with a peer that never handshakes: first %v, next %v", first, next)
	if first > 3*time.Second || next > time.Second {
		t.Errorf("claims took %v and %v; the connect bound is %v", first, next, api.PeerConnectTimeout)
	}
}
