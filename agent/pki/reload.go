package pki

import (
	"crypto/tls"
	"crypto/x509"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"
)

// keySource hands out a node's certificate and re-reads it when its files
// change, so that rotating a certificate (write the new pair in place) takes
// effect at the next handshake without a restart.
//
// A change is seen by stat: same file, same size, same modification time
// means the same content. That costs two stat calls per handshake, which is
// noise next to the handshake itself, and needs no watcher goroutine.
type keySource struct {
	certPath, keyPath, caPath string
	pool                      *x509.CertPool
	usage                     x509.ExtKeyUsage
	now                       func() time.Time
	log                       *slog.Logger

	mu                sync.Mutex
	cert              *tls.Certificate
	certStat, keyStat fs.FileInfo // the files cert was read from
	badCert, badKey   fs.FileInfo // files that failed to load; not retried until they change
	lastErr           string      // logged once, not at every handshake
}

func newKeySource(f Files, pool *x509.CertPool, usage x509.ExtKeyUsage, o options) (*keySource, error) {
	s := &keySource{certPath: f.Cert, keyPath: f.Key, caPath: f.CA, pool: pool, usage: usage, now: o.now, log: o.log}
	// The first load has nothing to fall back to: its error is the caller's.
	if _, err := s.get(); err != nil {
		return nil, err
	}
	return s, nil
}

// get returns the current certificate. Once one has loaded, a failed reload
// keeps serving it: during a rotation the certificate and the key are
// written one after the other, and the half-written moment must not take
// the agent off the network. The failure is logged and retried when the
// files change again.
func (s *keySource) get() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Stat before reading: if a file changes in between, the stamp is the
	// older one and the next handshake reads it again.
	cs, certErr := os.Stat(s.certPath)
	ks, keyErr := os.Stat(s.keyPath)
	if certErr == nil && keyErr == nil {
		if s.cert != nil && sameFile(cs, s.certStat) && sameFile(ks, s.keyStat) {
			return s.cert, nil
		}
		if s.cert != nil && sameFile(cs, s.badCert) && sameFile(ks, s.badKey) {
			return s.cert, nil
		}
	}
	c, err := loadKeyPair(s.certPath, s.keyPath, s.caPath, s.pool, s.now(), s.usage)
	if err != nil {
		if s.cert == nil {
			return nil, err
		}
		s.badCert, s.badKey = cs, ks
		if err.Error() != s.lastErr {
			s.lastErr = err.Error()
			s.log.Warn("TLS certificate changed but cannot be used; still serving the previous one",
				"cert", s.certPath, "key", s.keyPath, "err", err)
		}
		return s.cert, nil
	}
	if s.cert != nil {
		s.log.Info("TLS certificate reloaded", "cert", s.certPath,
			"not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	s.cert, s.certStat, s.keyStat = c, cs, ks
	s.badCert, s.badKey, s.lastErr = nil, nil, ""
	return c, nil
}

// sameFile reports whether b (possibly nil) describes the same, unchanged
// file as a; a nil a (stat failed) never matches.
func sameFile(a, b fs.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
