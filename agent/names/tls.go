package names

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/hashicorp/raft"
)

// TLSStreamLayer carries raft between registry servers over mutual TLS:
// both ends present a certificate of the cluster's CA, and both refuse a
// peer whose certificate names a node that is not a registry server, so
// another agent of the cluster cannot pose as a voter.
type TLSStreamLayer struct {
	ln     net.Listener
	server *tls.Config
	client *tls.Config
	// advertise, when set, is the address Addr reports (the listener may
	// be bound to 0.0.0.0).
	advertise net.Addr
	// nodeAt, when set, names the node an address belongs to: a dialled
	// server must then present that node's certificate.
	nodeAt func(address string) string
}

var _ raft.StreamLayer = (*TLSStreamLayer)(nil)

// NewTLSStreamLayer wraps a TCP listener. server and client come from
// pki.ServerConfig and pki.ClientConfig (the peer's certificate must carry
// the address dialled); isServer says whether a node name is a registry
// server (Registry.IsServer once the registry runs).
func NewTLSStreamLayer(ln net.Listener, server, client *tls.Config, isServer func(node string) bool) (*TLSStreamLayer, error) {
	if server == nil || client == nil || isServer == nil {
		return nil, errors.New("names: the TLS stream layer needs a server and a client configuration and a server check")
	}
	return &TLSStreamLayer{
		ln:     ln,
		server: withServerCheck(server, isServer, "client"),
		client: withServerCheck(client, isServer, "server"),
	}, nil
}

// withServerCheck adds, after the configuration's own checks, that the
// peer's verified certificate names a registry server.
func withServerCheck(base *tls.Config, isServer func(string) bool, side string) *tls.Config {
	cfg := base.Clone()
	prev := base.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if prev != nil {
			if err := prev(cs); err != nil {
				return err
			}
		}
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("names: raft %s presented no certificate", side)
		}
		// Go has verified the chain by now (or prev did, for a config that
		// verifies by itself).
		name, err := pki.NodeName(cs.PeerCertificates[0])
		if err != nil {
			return fmt.Errorf("names: raft %s certificate: %w", side, err)
		}
		if !isServer(name) {
			return fmt.Errorf("names: raft %s %q is not a name registry server", side, name)
		}
		return nil
	}
	return cfg
}

// Accept waits for the next connection; its handshake, and the check of
// the peer, run on its first read.
func (l *TLSStreamLayer) Accept() (net.Conn, error) {
	c, err := l.ln.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(c, l.server), nil
}

// Close stops listening.
func (l *TLSStreamLayer) Close() error { return l.ln.Close() }

// Addr is the listening address, or the advertised one.
func (l *TLSStreamLayer) Addr() net.Addr {
	if l.advertise != nil {
		return l.advertise
	}
	return l.ln.Addr()
}

// Advertise makes Addr report addr (host:port others reach this server
// at) instead of the listener's own address. Call it before raft starts.
func (l *TLSStreamLayer) Advertise(addr string) error {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return fmt.Errorf("names: advertised raft address %q: %w", addr, err)
	}
	l.advertise = a
	return nil
}

// ExpectNodes makes Dial require, beyond a registry server, the node that
// nodeAt names for the dialled address (when it names one): an address
// that now belongs to another node is refused. Call it before raft starts.
func (l *TLSStreamLayer) ExpectNodes(nodeAt func(address string) string) { l.nodeAt = nodeAt }

// Dial connects to a registry server and completes the handshake.
func (l *TLSStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	cfg := l.client
	if l.nodeAt != nil {
		if want := l.nodeAt(string(address)); want != "" {
			cfg = cfg.Clone()
			prev := cfg.VerifyConnection
			cfg.VerifyConnection = func(cs tls.ConnectionState) error {
				if err := prev(cs); err != nil {
					return err
				}
				if got, _ := pki.NodeName(cs.PeerCertificates[0]); got != want {
					return fmt.Errorf("names: raft server at %s is %q, expected %q", address, got, want)
				}
				return nil
			}
		}
	}
	c, err := tls.DialWithDialer(d, "tcp", string(address), cfg)
	if err != nil {
		return nil, fmt.Errorf("names: raft connection to %s: %w", address, err)
	}
	return c, nil
}

// NewTLSTransport is raft's network transport over a TLSStreamLayer.
func NewTLSTransport(layer *TLSStreamLayer, log *slog.Logger) *raft.NetworkTransport {
	return NewTLSTransportResolving(layer, nil, log)
}

// NewTLSTransportResolving is NewTLSTransport with servers' addresses
// looked up by their IDs (node names) at each connection, falling back to
// the address in raft's configuration when resolve has none: an agent
// whose raft port is ephemeral advertises it in gossip, and a restart on
// another port is found there.
func NewTLSTransportResolving(layer *TLSStreamLayer, resolve raft.ServerAddressProvider, log *slog.Logger) *raft.NetworkTransport {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:                layer,
		ServerAddressProvider: resolve,
		MaxPool:               3,
		// 1 turns raft's pipelined replication off: every AppendEntries
		// waits for its answer. With pipelining, a follower that answers
		// a newer term or a failure ends the pipeline's reader while its
		// writer may still queue one more request, which then blocks for
		// ever: the leader stops replicating to that follower and its
		// Shutdown never returns (seen as an agent whose stop hung in
		// raft's Shutdown, and in other projects on raft 1.7 and 1.8).
		// The registry's writes are small and few: one round trip each
		// either way (claim p50 at 50 agents 4.65 ms without, 4.55 ms
		// with, within the runs' spread; BENCHMARKS.md).
		MaxRPCsInFlight: 1,
		Timeout:         10 * time.Second,
		Logger:          newHCLog(log.With("component", "raft-transport")),
	})
}
