package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCreateCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	if err := CreateCA(dir, "", year); err != nil {
		t.Fatal(err)
	}
	checkMode(t, dir, fs.ModeDir|0o700)
	checkMode(t, filepath.Join(dir, CACertFile), 0o644)
	checkMode(t, filepath.Join(dir, CAKeyFile), 0o600)

	ca, key, err := loadCA(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if ca.Subject.CommonName != DefaultCAName || !ca.IsCA || !ca.MaxPathLenZero || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("CA certificate: CN %q IsCA %v MaxPathLenZero %v KeyUsage %b", ca.Subject.CommonName, ca.IsCA, ca.MaxPathLenZero, ca.KeyUsage)
	}
	if err := ca.CheckSignatureFrom(ca); err != nil {
		t.Fatalf("CA is not self-signed: %v", err)
	}
	if pub, ok := key.Public().(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("CA key is %T, want ECDSA P-256", key.Public())
	}
	if d := time.Until(ca.NotAfter); d < year-time.Minute || d > year {
		t.Fatalf("CA valid for %s more, want about a year", d)
	}
}

func TestIssueCert(t *testing.T) {
	c := cluster{caDir: filepath.Join(t.TempDir(), "ca"), nodeDir: filepath.Join(t.TempDir(), "out")}
	if err := CreateCA(c.caDir, "test CA", 2*year); err != nil {
		t.Fatal(err)
	}
	hosts := []string{"10.0.0.7", "fd00::7", "GPU-07.Example.COM.", "gpu-07.example.com", "10.0.0.7", "node-7"}
	if err := IssueCert(c.caDir, c.nodeDir, "node-7", hosts, 30*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	f := c.files("node-7")
	checkMode(t, f.Cert, 0o644)
	checkMode(t, f.Key, 0o600)

	cert, err := LoadCertificate(f.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "node-7" || cert.IsCA {
		t.Fatalf("CN %q IsCA %v, want node-7, not a CA", cert.Subject.CommonName, cert.IsCA)
	}
	if want := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}; !slices.Equal(cert.ExtKeyUsage, want) {
		t.Fatalf("ExtKeyUsage %v, want %v", cert.ExtKeyUsage, want)
	}
	if want := []string{"node-7", "gpu-07.example.com"}; !slices.Equal(cert.DNSNames, want) {
		t.Fatalf("DNS SANs %q, want %q (node name first, hosts lower-cased, no duplicates)", cert.DNSNames, want)
	}
	var ips []string
	for _, ip := range cert.IPAddresses {
		ips = append(ips, ip.String())
	}
	if want := []string{"10.0.0.7", "fd00::7"}; !slices.Equal(ips, want) {
		t.Fatalf("IP SANs %q, want %q", ips, want)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != "gpuherd:node:node-7" {
		t.Fatalf("URI SANs %v, want gpuherd:node:node-7", cert.URIs)
	}
	if name, err := NodeName(cert); err != nil || name != "node-7" {
		t.Fatalf("NodeName = %q, %v", name, err)
	}
	if err := cert.VerifyHostname("10.0.0.7"); err != nil {
		t.Fatal(err)
	}
	// The issued files load as a working identity on both sides.
	if _, err := ServerConfig(f); err != nil {
		t.Fatal(err)
	}
	if _, err := ClientConfig(f); err != nil {
		t.Fatal(err)
	}
}

func TestOverwriteRefused(t *testing.T) {
	c := newCluster(t)
	caCert := filepath.Join(c.caDir, CACertFile)
	f := c.files("node-a")
	before := map[string][]byte{}
	for _, p := range []string{caCert, filepath.Join(c.caDir, CAKeyFile), f.Cert, f.Key} {
		before[p] = readFile(t, p)
	}

	err := CreateCA(c.caDir, "again", year)
	wantErr(t, err, "refusing to overwrite", caCert, "remove them first, or use another directory")
	err = IssueCert(c.caDir, c.nodeDir, "node-a", nil, year)
	wantErr(t, err, "refusing to overwrite", f.Cert, f.Key)

	// One file of the pair left over is refused too, and nothing is created.
	if err := os.Remove(f.Cert); err != nil {
		t.Fatal(err)
	}
	delete(before, f.Cert)
	err = IssueCert(c.caDir, c.nodeDir, "node-a", nil, year)
	wantErr(t, err, "refusing to overwrite "+f.Key+": remove it first")
	if _, err := os.Stat(f.Cert); !os.IsNotExist(err) {
		t.Fatalf("a refused IssueCert left %s behind (%v)", f.Cert, err)
	}
	for p, b := range before {
		if !bytes.Equal(readFile(t, p), b) {
			t.Fatalf("%s changed", p)
		}
	}
}

func TestIssueCertRefusesBadInput(t *testing.T) {
	c := newCluster(t)
	now := time.Now()
	for _, tc := range []struct {
		name     string
		caDir    string
		node     string
		hosts    []string
		now      time.Time
		validity time.Duration
		want     string
	}{
		{"upper-case node", c.caDir, "Node-1", nil, now, year, "lower-case"},
		{"node with slash", c.caDir, "a/b", nil, now, year, "lower-case"},
		{"node too long", c.caDir, strings.Repeat("a", 64), nil, now, year, "at most 63"},
		{"empty node", c.caDir, "", nil, now, year, "empty"},
		{"bad host", c.caDir, "node-1", []string{"not a host"}, now, year, `host "not a host"`},
		{"bracketed IPv6", c.caDir, "node-1", []string{"[::1]"}, now, year, "bare IP"},
		{"empty host", c.caDir, "node-1", []string{""}, now, year, "host is empty"},
		{"zero validity", c.caDir, "node-1", nil, now, 0, "must be positive"},
		{"outlives the CA", c.caDir, "node-1", nil, now, 3 * year, "after its CA"},
		{"CA not valid yet", c.caDir, "node-1", nil, now.Add(-24 * time.Hour), year, "is not valid before"},
		{"no CA", t.TempDir(), "node-1", nil, now, year, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			wantErr(t, issueCert(tc.caDir, out, tc.node, tc.hosts, tc.now, tc.validity), tc.want)
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Fatalf("a refused IssueCert created %s", out)
			}
		})
	}
}

func TestCreateCARefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name     string
		caName   string
		validity time.Duration
		want     string
	}{
		{"long name", strings.Repeat("x", 65), year, "at most 64"},
		{"control character", "a\nb", year, "printable"},
		{"negative validity", "ok", -time.Hour, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, CreateCA(filepath.Join(t.TempDir(), "ca"), tc.caName, tc.validity), tc.want)
		})
	}
}

func TestValidateNames(t *testing.T) {
	for name, ok := range map[string]bool{
		"gpu-01": true, "a": true, "gpu01.rack3.dc1": true, "0": true,
		"": false, "-a": false, "a-": false, "a..b": false, "A": false, "a_b": false, "a b": false,
		strings.Repeat("a", 63): true, strings.Repeat("a", 64): false,
	} {
		if err := ValidateNodeName(name); (err == nil) != ok {
			t.Errorf("ValidateNodeName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
	for host, ok := range map[string]bool{
		"10.1.2.3": true, "::1": true, "2001:db8::1": true, "a.example.com": true, "Host-1": true, "host.": true,
		"": false, "-a.com": false, "a..com": false, "fe80::1%eth0": false, "[::1]": false, "a_b.com": false,
		"*.example.com": false, strings.Repeat("a", 64) + ".com": false,
	} {
		if err := ValidateHost(host); (err == nil) != ok {
			t.Errorf("ValidateHost(%q) = %v, want ok=%v", host, err, ok)
		}
	}
}

func TestNodeName(t *testing.T) {
	u := func(s string) *url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		cert x509.Certificate
		want string // "" means an error
	}{
		{"URI and CN", x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, URIs: []*url.URL{u("gpuherd:node:n1")}}, "n1"},
		{"URI only", x509.Certificate{URIs: []*url.URL{u("gpuherd:node:n1")}}, "n1"},
		{"CN only (external CA)", x509.Certificate{Subject: pkix.Name{CommonName: "n1"}}, "n1"},
		{"other URIs ignored", x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, URIs: []*url.URL{u("spiffe://x/n2")}}, "n1"},
		{"URI and CN disagree", x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, URIs: []*url.URL{u("gpuherd:node:n2")}}, ""},
		{"two node URIs", x509.Certificate{URIs: []*url.URL{u("gpuherd:node:n1"), u("gpuherd:node:n2")}}, ""},
		{"no name", x509.Certificate{}, ""},
		{"CN not a node name", x509.Certificate{Subject: pkix.Name{CommonName: "Some Client"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NodeName(&tc.cert)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("NodeName = %q, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NodeName = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// A server certificate from a CA that knows nothing of gpuherd (no URI SAN)
// still identifies its node by common name.
func TestClientConfigForAcceptsCommonNameOnlyCertificate(t *testing.T) {
	c := newCluster(t)
	ca, caKey, err := loadCA(c.caDir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, keyPEM, err := newKey()
	if err != nil {
		t.Fatal(err)
	}
	serial, err := newSerial()
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "node-x"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	f := Files{CA: c.files("node-a").CA, Cert: filepath.Join(t.TempDir(), "x.crt"), Key: filepath.Join(t.TempDir(), "x.key")}
	if err := writeNew(f.Cert, pemCert(der), certMode); err != nil {
		t.Fatal(err)
	}
	if err := writeNew(f.Key, keyPEM, keyMode); err != nil {
		t.Fatal(err)
	}
	srv, err := ServerConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, srv)
	cfg, err := ClientConfigFor(c.files("node-a"), "node-x")
	if err != nil {
		t.Fatal(err)
	}
	if body, err := get(t, addr, cfg); err != nil || body != "node-a" {
		t.Fatalf("got %q, %v", body, err)
	}
}

func checkMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeDir | fs.ModePerm); got != want {
		t.Fatalf("%s has mode %v, want %v", path, got, want)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
