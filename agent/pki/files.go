package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// File modes: certificates are public, keys are for the agent (root) alone.
const (
	certMode = 0o644
	keyMode  = 0o600
)

// dateFmt prints validity dates in errors: UTC, to the second, unambiguous.
const dateFmt = "2006-01-02 15:04:05 UTC"

// readPEMFile reads a PEM file, turning "not there" into advice.
func readPEMFile(path, what string) ([]byte, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s %s does not exist: check the path, or create it with \"gpuherd tls\"", what, path)
	case err != nil:
		return nil, fmt.Errorf("read %s %s: %w", what, path, err)
	}
	return data, nil
}

// parseCertsPEM returns every CERTIFICATE block of a PEM file, leaf first.
func parseCertsPEM(path, what string, data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s %s: certificate %d does not parse: %w", what, path, len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s %s holds no PEM certificate", what, path)
	}
	return certs, nil
}

// parseKeyPEM returns the first private key of a PEM file (PKCS#8, or the
// SEC 1 "EC PRIVATE KEY" that openssl writes).
func parseKeyPEM(path string, data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("private key %s holds no PEM private key", path)
		}
		var (
			k   any
			err error
		)
		switch block.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(block.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("private key %s does not parse: %w", path, err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("private key %s: %T cannot sign", path, k)
		}
		return s, nil
	}
}

// keyMatches reports whether the private key belongs to the certificate.
func keyMatches(key crypto.Signer, cert *x509.Certificate) bool {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(cert.PublicKey)
}

// checkDates refuses a certificate outside its validity period at now.
func checkDates(path, what string, c *x509.Certificate, now time.Time) error {
	if now.Before(c.NotBefore) {
		return fmt.Errorf("%s %s is not valid before %s (valid %s to %s; now %s): check this server's clock",
			what, path, c.NotBefore.UTC().Format(dateFmt), c.NotBefore.UTC().Format(dateFmt), c.NotAfter.UTC().Format(dateFmt), now.UTC().Format(dateFmt))
	}
	if now.After(c.NotAfter) {
		return fmt.Errorf("%s %s expired on %s (valid %s to %s; now %s): issue a new one",
			what, path, c.NotAfter.UTC().Format(dateFmt), c.NotBefore.UTC().Format(dateFmt), c.NotAfter.UTC().Format(dateFmt), now.UTC().Format(dateFmt))
	}
	return nil
}

// LoadCertificate reads the first certificate of a PEM file.
func LoadCertificate(path string) (*x509.Certificate, error) {
	data, err := readPEMFile(path, "certificate")
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(path, "certificate", data)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// loadCAPool reads a CA bundle (one or more CA certificates) into a pool.
func loadCAPool(path string, now time.Time) (*x509.CertPool, error) {
	data, err := readPEMFile(path, "CA certificate")
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(path, "CA certificate", data)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	valid := 0
	var dateErr error
	for _, c := range certs {
		if !c.IsCA {
			return nil, fmt.Errorf("CA certificate %s: %q is not a CA certificate (basic constraints CA:FALSE); point tls_ca at the CA's ca.crt", path, c.Subject.CommonName)
		}
		// A bundle may keep an expired CA during a rotation; only a bundle
		// with nothing valid left is an error worth stopping for.
		if err := checkDates(path, "CA certificate", c, now); err != nil {
			dateErr = err
			continue
		}
		pool.AddCert(c)
		valid++
	}
	if valid == 0 {
		return nil, dateErr
	}
	return pool, nil
}

// loadKeyPair reads a node's certificate and key and checks everything a
// peer would check, so a bad file fails here with its name rather than as
// an anonymous handshake error on the other side.
func loadKeyPair(certPath, keyPath, caPath string, pool *x509.CertPool, now time.Time, usage x509.ExtKeyUsage) (*tls.Certificate, error) {
	certPEM, err := readPEMFile(certPath, "certificate")
	if err != nil {
		return nil, err
	}
	keyPEM, err := readPEMFile(keyPath, "private key")
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(certPath, "certificate", certPEM)
	if err != nil {
		return nil, err
	}
	key, err := parseKeyPEM(keyPath, keyPEM)
	if err != nil {
		return nil, err
	}
	leaf := certs[0]
	if !keyMatches(key, leaf) {
		return nil, fmt.Errorf("private key %s does not match certificate %s: install the key issued with that certificate", keyPath, certPath)
	}
	if err := checkDates(certPath, "certificate", leaf, now); err != nil {
		return nil, err
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         pool,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	}); err != nil {
		return nil, fmt.Errorf("certificate %s is not valid under CA %s: %w (issue it from that CA with \"gpuherd tls cert\")", certPath, caPath, err)
	}
	if _, err := NodeName(leaf); err != nil {
		return nil, fmt.Errorf("certificate %s: %w", certPath, err)
	}
	out := &tls.Certificate{PrivateKey: key, Leaf: leaf}
	for _, c := range certs {
		out.Certificate = append(out.Certificate, c.Raw)
	}
	return out, nil
}

// writeNewPair writes a certificate and its key, refusing to replace either:
// overwriting a CA key orphans every certificate it signed, and overwriting
// a node key breaks a running agent, so replacing is always a human's call.
// On failure nothing it created is left behind.
func writeNewPair(dir string, dirMode fs.FileMode, certPath string, certPEM []byte, keyPath string, keyPEM []byte) error {
	var exist []string
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Lstat(p); err == nil {
			exist = append(exist, p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("check %s: %w", p, err)
		}
	}
	if len(exist) > 0 {
		them := "it"
		if len(exist) > 1 {
			them = "them"
		}
		return fmt.Errorf("refusing to overwrite %s: remove %s first, or use another directory", strings.Join(exist, " and "), them)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("create directory %s: %w", dir, err)
	}
	// The key first: a certificate without its key is useless, and a
	// crash in between leaves the secret half, at mode 0600.
	if err := writeNew(keyPath, keyPEM, keyMode); err != nil {
		return err
	}
	if err := writeNew(certPath, certPEM, certMode); err != nil {
		_ = os.Remove(keyPath)
		return err
	}
	return nil
}

// writeNew creates path exclusively (O_EXCL closes the race with a
// concurrent writer) with exactly mode, whatever the umask.
func writeNew(path string, data []byte, mode fs.FileMode) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("refusing to overwrite %s: remove it first, or use another directory", path)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}

// NodeFiles returns the paths of a node's certificate and key in dir, as
// IssueCert names them.
func NodeFiles(dir, node string) (cert, key string) {
	return filepath.Join(dir, node+".crt"), filepath.Join(dir, node+".key")
}
