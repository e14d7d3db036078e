package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"time"
	"unicode"
)

// File names inside a CA directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// DefaultCAName is the CA's common name when none is given.
const DefaultCAName = "gpuherd CA"

// backdate starts every certificate a little in the past, so a server whose
// clock runs a few minutes behind the issuer's still accepts it.
const backdate = 5 * time.Minute

// maxCANameLen is the X.520 upper bound for a common name.
const maxCANameLen = 64

// CreateCA writes a new self-signed ECDSA P-256 CA to dir/ca.crt (0644) and
// dir/ca.key (0600), creating dir (0700) if needed.
func CreateCA(dir, name string, validity time.Duration) error {
	return createCA(dir, name, time.Now(), validity)
}

// IssueCert writes outDir/<node>.crt (0644) and outDir/<node>.key (0600): a
// certificate for node, usable as server and as client, signed by the CA in
// caDir. hosts (IP addresses and DNS names) become subject alternative names
// so that peers may also verify the certificate by the address they dial.
func IssueCert(caDir, outDir, node string, hosts []string, validity time.Duration) error {
	return issueCert(caDir, outDir, node, hosts, time.Now(), validity)
}

// createCA is CreateCA at a given time; tests backdate it.
func createCA(dir, name string, now time.Time, validity time.Duration) error {
	if name == "" {
		name = DefaultCAName
	}
	if len(name) > maxCANameLen || strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return fmt.Errorf("CA name %q: use at most %d printable characters", name, maxCANameLen)
	}
	if validity <= 0 {
		return fmt.Errorf("CA validity %s: must be positive", validity)
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return err
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		// The CA signs node certificates only, never another CA.
		MaxPathLenZero: true,
		KeyUsage:       x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return fmt.Errorf("sign CA certificate: %w", err)
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	// 0700: the directory holds the key that can mint any node's identity.
	return writeNewPair(dir, 0o700, certPath, pemCert(der), keyPath, keyPEM)
}

// issueCert is IssueCert at a given time; tests use it to make certificates
// that are already expired.
func issueCert(caDir, outDir, node string, hosts []string, now time.Time, validity time.Duration) error {
	if err := ValidateNodeName(node); err != nil {
		return err
	}
	if validity <= 0 {
		return fmt.Errorf("certificate validity %s: must be positive", validity)
	}
	dns := []string{node}
	var ips []net.IP
	seen := map[string]bool{node: true}
	for _, h := range hosts {
		if err := ValidateHost(h); err != nil {
			return err
		}
		if a, err := netip.ParseAddr(h); err == nil {
			a = a.Unmap()
			if !seen[a.String()] {
				seen[a.String()] = true
				ips = append(ips, net.IP(a.AsSlice()))
			}
			continue
		}
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if !seen[h] {
			seen[h] = true
			dns = append(dns, h)
		}
	}
	caCert, caKey, err := loadCA(caDir, now)
	if err != nil {
		return err
	}
	notAfter := now.Add(validity)
	if notAfter.After(caCert.NotAfter) {
		return fmt.Errorf("certificate for %s would be valid until %s, after its CA %s expires (%s): ask for fewer days or create a new CA",
			node, notAfter.UTC().Format(dateFmt), filepath.Join(caDir, CACertFile), caCert.NotAfter.UTC().Format(dateFmt))
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return err
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: node},
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		BasicConstraintsValid: true,
		// ECDSA keys sign; they never encipher, so no KeyEncipherment.
		KeyUsage: x509.KeyUsageDigitalSignature,
		// An agent serves its API and calls its peers with one identity.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    dns,
		IPAddresses: ips,
		URIs:        []*url.URL{nodeURI(node)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("sign certificate for %s: %w", node, err)
	}
	certPath, keyPath := NodeFiles(outDir, node)
	return writeNewPair(outDir, 0o755, certPath, pemCert(der), keyPath, keyPEM)
}

// loadCA reads the CA certificate and key from caDir and checks that they
// can sign: a CA certificate, its own key, valid now.
func loadCA(caDir string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	certPath, keyPath := filepath.Join(caDir, CACertFile), filepath.Join(caDir, CAKeyFile)
	certPEM, err := readPEMFile(certPath, "CA certificate")
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := readPEMFile(keyPath, "CA private key")
	if err != nil {
		return nil, nil, err
	}
	certs, err := parseCertsPEM(certPath, "CA certificate", certPEM)
	if err != nil {
		return nil, nil, err
	}
	if len(certs) != 1 {
		return nil, nil, fmt.Errorf("CA certificate %s holds %d certificates; the signing CA directory must hold exactly one", certPath, len(certs))
	}
	ca := certs[0]
	if !ca.IsCA || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, fmt.Errorf("CA certificate %s is not a CA that may sign certificates (needs CA:TRUE and keyCertSign)", certPath)
	}
	key, err := parseKeyPEM(keyPath, keyPEM)
	if err != nil {
		return nil, nil, err
	}
	if !keyMatches(key, ca) {
		return nil, nil, fmt.Errorf("CA private key %s does not match CA certificate %s", keyPath, certPath)
	}
	if err := checkDates(certPath, "CA certificate", ca, now); err != nil {
		return nil, nil, err
	}
	return ca, key, nil
}

// newKey makes an ECDSA P-256 key: small, fast, and accepted everywhere TLS
// 1.3 is.
func newKey() (crypto.Signer, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// newSerial is a random positive serial number below 2^128 (RFC 5280
// allows 20 octets; randomness keeps two certificates of one CA from ever
// sharing one).
func newSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	s, err := rand.Int(rand.Reader, limit.Sub(limit, big.NewInt(1)))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
