package names

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/hashicorp/raft"
)

const certValidity = 24 * time.Hour

// tlsCA is a cluster CA with node certificates for loopback.
type tlsCA struct{ caDir, nodeDir string }

func newTLSCA(t testing.TB, nodes ...string) tlsCA {
	t.Helper()
	ca := tlsCA{caDir: filepath.Join(t.TempDir(), "ca"), nodeDir: filepath.Join(t.TempDir(), "nodes")}
	if err := pki.CreateCA(ca.caDir, "names test CA", 2*certValidity); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := pki.IssueCert(ca.caDir, ca.nodeDir, n, []string{"127.0.0.1"}, certValidity); err != nil {
			t.Fatal(err)
		}
	}
	return ca
}

func (ca tlsCA) files(node string) pki.Files {
	cert, key := pki.NodeFiles(ca.nodeDir, node)
	return pki.Files{CA: filepath.Join(ca.caDir, pki.CACertFile), Cert: cert, Key: key}
}

func (ca tlsCA) configs(t testing.TB, node string) (server, client *tls.Config) {
	t.Helper()
	server, err := pki.ServerConfig(ca.files(node))
	if err != nil {
		t.Fatal(err)
	}
	client, err = pki.ClientConfig(ca.files(node))
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

// tlsCluster starts voters on loopback with raft over mutual TLS.
func tlsCluster(t testing.TB, ca tlsCA, voters []string, timing Timing) map[string]*Registry {
	t.Helper()
	isServer := func(n string) bool { return slices.Contains(voters, n) }
	lns := map[string]net.Listener{}
	var servers []Server
	for _, v := range voters {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[v] = ln
		servers = append(servers, Server{ID: v, Address: ln.Addr().String()})
	}
	mem := NewMemNetwork()
	regs := map[string]*Registry{}
	for _, v := range voters {
		srv, cli := ca.configs(t, v)
		layer, err := NewTLSStreamLayer(lns[v], srv, cli, isServer)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := Open(Config{
			Node: v, Role: RoleVoter, Servers: servers, DataDir: filepath.Join(t.TempDir(), v),
			Transport: NewTLSTransport(layer, nil), Forwarder: mem.From(v), Timing: timing,
		})
		if err != nil {
			t.Fatal(err)
		}
		mem.Attach(v, reg)
		regs[v] = reg
		t.Cleanup(func() { reg.Close() })
	}
	return regs
}

func waitLeader(t testing.TB, regs map[string]*Registry) string {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for id, r := range regs {
			if r.IsLeader() {
				return id
			}
		}
	}
	t.Fatal("no leader over TLS")
	return ""
}

// Three voters on real sockets with mutual TLS elect a leader, replicate
// names, and refuse a raft connection from a node of the same CA that is
// not a registry server, or from a client without a certificate.
func TestTLSClusterOnLoopback(t *testing.T) {
	voters := []string{"node-a", "node-b", "node-c"}
	ca := newTLSCA(t, append(voters, "node-z")...)
	regs := tlsCluster(t, ca, voters, FastTiming())
	leader := waitLeader(t, regs)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	follower := "node-a"
	if follower == leader {
		follower = "node-b"
	}
	g, err := regs[follower].Acquire(ctx, Claim("vm"), follower, "", "req", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := regs[follower].Confirm(ctx, Claim("vm"), g.Record.Token, follower, nil); err != nil {
		t.Fatal(err)
	}
	// Every voter's own copy gets the name over the TLS transport.
	for id, r := range regs {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			rec, err := r.Lookup(ctx, Claim("vm"), Stale)
			if err == nil && rec.State == StateHeld {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never saw the name: %v", id, err)
			}
		}
	}

	addr := regs[leader].Raft().Leader()
	// A node of the CA that is not a registry server is refused.
	_, cli := ca.configs(t, "node-z")
	if err := tlsRefused(t, string(addr), cli); err == nil {
		t.Fatal("node-z, not a registry server, was accepted")
	}
	// So is a client without a certificate.
	noCert := cli.Clone()
	noCert.GetClientCertificate = nil
	if err := tlsRefused(t, string(addr), noCert); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	// And a voter checks whom it dials: a listener with node-z's
	// certificate at a server's address is refused.
	zsrv, _ := ca.configs(t, "node-z")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", zsrv)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	asrv, acli := ca.configs(t, "node-a")
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	layer, err := NewTLSStreamLayer(raw, asrv, acli, func(n string) bool { return slices.Contains(voters, n) })
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	if _, err := layer.Dial(raft.ServerAddress(ln.Addr().String()), time.Second); err == nil || !strings.Contains(err.Error(), "not a name registry server") {
		t.Fatalf("dialling node-z: %v", err)
	}
}

// tlsRefused dials addr and returns the error that ends the connection:
// in TLS 1.3 the server's verdict on the client arrives on the first read.
func tlsRefused(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	return err
}

// The registry's transport replicates without raft's pipeline, whose
// reader and writer can block each other for ever once a follower refuses
// an AppendEntries (a newer term): the leader then never replicates to it
// again and its Shutdown hangs.
func TestTLSTransportDoesNotPipeline(t *testing.T) {
	ca := newTLSCA(t, "gpu-a")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, cli := ca.configs(t, "gpu-a")
	layer, err := NewTLSStreamLayer(ln, srv, cli, func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	trans := NewTLSTransport(layer, nil)
	defer trans.Close()
	if _, err := trans.AppendEntriesPipeline("gpu-a", raft.ServerAddress(ln.Addr().String())); !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("AppendEntriesPipeline: %v; want raft.ErrPipelineReplicationNotSupported", err)
	}
}
