package pki

import (
	"crypto/x509"
	"fmt"
	"os"
	"time"
)

// CheckFiles checks a node's TLS files before the agent uses them: the CA
// bundle, the certificate's chain to it for both server and client use, the
// key matching the certificate, the certificate naming node, and the private
// key readable by its owner alone (the owner being the agent's user or
// root). `gpuherd config check` and the agent's start run it.
func CheckFiles(f Files, node string, now time.Time) error {
	if err := f.check(); err != nil {
		return err
	}
	pool, err := loadCAPool(f.CA, now)
	if err != nil {
		return err
	}
	if err := checkPrivateFile(f.Key); err != nil {
		return err
	}
	var leaf *x509.Certificate
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		pair, err := loadKeyPair(f.Cert, f.Key, f.CA, pool, now, usage)
		if err != nil {
			return err
		}
		leaf = pair.Leaf
	}
	name, err := NodeName(leaf)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", f.Cert, err)
	}
	if name != node {
		return fmt.Errorf("certificate %s names node %q, but this server's node_name is %q: other agents would refuse it; issue one for %q with \"gpuherd tls cert\"", f.Cert, name, node, node)
	}
	return nil
}

// checkPrivateFile refuses a key file that group or others may read, or that
// belongs to another user.
func checkPrivateFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("private key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("private key %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("private key %s has mode %04o: it must not be readable by group or others; run chmod 600 %s", path, perm, path)
	}
	if uid, ok := owner(fi); ok && uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("private key %s is owned by uid %d, not by the agent's user (uid %d) or root: run chown root: %s", path, uid, os.Geteuid(), path)
	}
	return nil
}
