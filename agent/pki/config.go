package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"
)

// Files names the PEM files of one node's TLS identity.
type Files struct {
	// CA is the CA bundle that peers' certificates must chain to (tls_ca).
	CA string
	// Cert is this node's certificate, optionally followed by intermediates (tls_cert).
	Cert string
	// Key is this node's private key (tls_key).
	Key string
}

func (f Files) check() error {
	for _, x := range []struct{ v, key string }{{f.CA, "tls_ca"}, {f.Cert, "tls_cert"}, {f.Key, "tls_key"}} {
		if x.v == "" {
			return fmt.Errorf("%s is not set: mutual TLS needs the CA, certificate and key files (create them with \"gpuherd tls\")", x.key)
		}
	}
	return nil
}

// Option adjusts ServerConfig, ClientConfig and ClientConfigFor.
type Option func(*options)

type options struct {
	log *slog.Logger
	now func() time.Time
}

// WithLogger receives certificate reloads and reload failures; nil keeps
// them quiet.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithClock sets the clock that certificate validity is checked against;
// nil keeps time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

func buildOptions(opts []Option) options {
	o := options{log: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// ServerConfig is the TLS configuration of an agent's HTTPS listener: TLS
// 1.3 only, and every client must present a certificate from the CA that
// names a node.
func ServerConfig(f Files, opts ...Option) (*tls.Config, error) {
	o := buildOptions(opts)
	if err := f.check(); err != nil {
		return nil, err
	}
	pool, err := loadCAPool(f.CA, o.now())
	if err != nil {
		return nil, err
	}
	src, err := newKeySource(f, pool, x509.ExtKeyUsageServerAuth, o)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  pool,
		Time:       o.now,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return src.get()
		},
		// Refuse, at the handshake, a certificate of the CA that names no
		// node, so PeerName never fails on an accepted request.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return errors.New("gpuherd: client presented no verified certificate")
			}
			if _, err := NodeName(cs.VerifiedChains[0][0]); err != nil {
				return fmt.Errorf("gpuherd: client certificate: %w", err)
			}
			return nil
		},
	}, nil
}

// ClientConfig is the TLS configuration for calling an agent by a name or
// address its certificate carries (see IssueCert's hosts): TLS 1.3, the CA
// as the only root, this node's certificate as the client certificate.
func ClientConfig(f Files, opts ...Option) (*tls.Config, error) {
	cfg, _, _, err := clientConfig(f, opts)
	return cfg, err
}

// ClientConfigFor is ClientConfig for calling one named node at whatever
// address gossip gave for it: the peer must present a certificate from the
// CA that names expectedNode, so a coordinator knows it reached the node it
// meant and not merely some node of the cluster. A caller that calls many
// nodes uses PeerConfigs, which reads the files once for all of them.
func ClientConfigFor(f Files, expectedNode string, opts ...Option) (*tls.Config, error) {
	if err := ValidateNodeName(expectedNode); err != nil {
		return nil, fmt.Errorf("expected peer: %w", err)
	}
	p, err := NewPeerConfigs(f, opts...)
	if err != nil {
		return nil, err
	}
	return p.For(expectedNode)
}

// PeerConfigs hands out ClientConfigFor's configurations, one per peer,
// from one reading of this node's files: the CA pool and the certificate
// (reloaded when its files change, as for every configuration) are shared,
// so a peer's configuration costs a few hundred bytes instead of its own
// parsed CA, certificate and key. An agent holds one per member of its
// cluster, thousands of them. The CA file is read again, for the
// configurations made after it, when it changed.
type PeerConfigs struct {
	f Files
	o options

	mu     sync.Mutex
	caStat fs.FileInfo // the CA file pool was read from
	pool   *x509.CertPool
	src    *keySource
}

// NewPeerConfigs reads f's CA, certificate and key, with ClientConfigFor's
// errors.
func NewPeerConfigs(f Files, opts ...Option) (*PeerConfigs, error) {
	p := &PeerConfigs{f: f, o: buildOptions(opts)}
	if err := f.check(); err != nil {
		return nil, err
	}
	if err := p.load(); err != nil {
		return nil, err
	}
	return p, nil
}

// load reads the CA pool and the certificate source when the CA file is
// not the one read last. Called with mu held, or before p is shared.
func (p *PeerConfigs) load() error {
	st, statErr := os.Stat(p.f.CA)
	if p.pool != nil && statErr == nil && sameFile(st, p.caStat) {
		return nil
	}
	pool, err := loadCAPool(p.f.CA, p.o.now())
	if err != nil {
		return err
	}
	src, err := newKeySource(p.f, pool, x509.ExtKeyUsageClientAuth, p.o)
	if err != nil {
		return err
	}
	p.pool, p.src, p.caStat = pool, src, st
	return nil
}

// For is the configuration for calling expectedNode (see ClientConfigFor).
// A CA file that changed and no longer loads is an error; configurations
// made before keep the CA they were made with.
func (p *PeerConfigs) For(expectedNode string) (*tls.Config, error) {
	if err := ValidateNodeName(expectedNode); err != nil {
		return nil, fmt.Errorf("expected peer: %w", err)
	}
	p.mu.Lock()
	err := p.load()
	pool, src := p.pool, p.src
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	cfg := clientConfigOf(pool, src, p.o)
	// Go's own check matches the certificate against the dialled host, and
	// agents dial an IP from gossip that the certificate need not carry. So
	// that check is switched off here and VerifyConnection does the whole
	// verification instead: the chain to the CA (as Go would), then the node
	// name in place of the host name. VerifyConnection runs on every
	// handshake, resumed ones included, and its error aborts the handshake.
	cfg.InsecureSkipVerify = true
	now := p.o.now
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		return verifyPeerNode(cs, pool, now(), expectedNode)
	}
	return cfg, nil
}

// ClientConfigAnyNode is ClientConfigFor for a caller that checks the
// node name itself (the name registry's raft connections, which must reach
// one of its servers at an address gossip gave): the peer must present a
// certificate from the CA that names some node; VerifyConnection may be
// wrapped to check which.
func ClientConfigAnyNode(f Files, opts ...Option) (*tls.Config, error) {
	cfg, pool, o, err := clientConfig(f, opts)
	if err != nil {
		return nil, err
	}
	cfg.InsecureSkipVerify = true // VerifyConnection verifies the chain (see ClientConfigFor)
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		return verifyPeerNode(cs, pool, o.now(), "")
	}
	return cfg, nil
}

func clientConfig(f Files, opts []Option) (*tls.Config, *x509.CertPool, options, error) {
	o := buildOptions(opts)
	if err := f.check(); err != nil {
		return nil, nil, o, err
	}
	pool, err := loadCAPool(f.CA, o.now())
	if err != nil {
		return nil, nil, o, err
	}
	src, err := newKeySource(f, pool, x509.ExtKeyUsageClientAuth, o)
	if err != nil {
		return nil, nil, o, err
	}
	return clientConfigOf(pool, src, o), pool, o, nil
}

// clientConfigOf is a client configuration presenting src's certificate,
// with pool as the only root.
func clientConfigOf(pool *x509.CertPool, src *keySource, o options) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    pool,
		Time:       o.now,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return src.get()
		},
	}
}

// verifyPeerNode checks a server's certificate chain against the CA and its
// node name against the one the caller meant to reach ("": any node).
func verifyPeerNode(cs tls.ConnectionState, pool *x509.CertPool, now time.Time, expected string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("gpuherd: peer presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         pool,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("gpuherd: certificate of peer %q: %w", leaf.Subject.CommonName, err)
	}
	name, err := NodeName(leaf)
	if err != nil {
		return fmt.Errorf("gpuherd: peer certificate: %w", err)
	}
	if expected != "" && name != expected {
		return fmt.Errorf("gpuherd: reached node %q, expected %q: the address belongs to another node (stale cluster view?)", name, expected)
	}
	return nil
}

// PeerName returns the node name of the verified client certificate of a
// request served with ServerConfig, for logging and authorisation.
func PeerName(r *http.Request) (string, error) {
	if r.TLS == nil {
		return "", errors.New("request did not arrive over TLS: no peer identity")
	}
	if len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", errors.New("request carries no verified client certificate")
	}
	return NodeName(r.TLS.VerifiedChains[0][0])
}
