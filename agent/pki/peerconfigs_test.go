package pki

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
)

// One reading of the files serves every peer's configuration: they hand
// out the same certificate, and each still checks the node it was made for.
func TestPeerConfigsShareTheFilesAndCheckTheirNode(t *testing.T) {
	c := newCluster(t)
	c.issue(t, "node-c")
	srvA, err := ServerConfig(c.files("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	addrA, _ := serve(t, srvA)
	p, err := NewPeerConfigs(c.files("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	forA, err := p.For("node-a")
	if err != nil {
		t.Fatal(err)
	}
	forC, err := p.For("node-c")
	if err != nil {
		t.Fatal(err)
	}
	if body, err := get(t, addrA, forA); err != nil || body != "node-b" {
		t.Fatalf("node-b → node-a: body %q, err %v", body, err)
	}
	// node-a's server is not node-c: the configuration for node-c refuses it.
	_, err = get(t, addrA, forC)
	wantErr(t, err, "node-a", "node-c")

	ca, err := forA.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := forC.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if ca != cc || forA.RootCAs != forC.RootCAs {
		t.Fatal("two peers' configurations each parsed the CA, certificate and key: they must share one reading")
	}
	if _, err := p.For("not a node name"); err == nil {
		t.Fatal("For accepted an invalid node name")
	}
}

// A CA file replaced (a CA rotation) is read for the configurations made
// after it; one that no longer loads is an error naming it, and the
// configurations made before keep working.
func TestPeerConfigsReadAChangedCA(t *testing.T) {
	c := newCluster(t)
	srvA, err := ServerConfig(c.files("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	addrA, _ := serve(t, srvA)
	f := c.files("node-b")
	p, err := NewPeerConfigs(f)
	if err != nil {
		t.Fatal(err)
	}
	before, err := p.For("node-a")
	if err != nil {
		t.Fatal(err)
	}

	// A bundle of the old CA and a new one, as a rotation begins.
	other := filepath.Join(t.TempDir(), "other-ca")
	if err := CreateCA(other, "next CA", 2*year); err != nil {
		t.Fatal(err)
	}
	oldCA := readFile(t, f.CA)
	bundle := append(append([]byte{}, oldCA...), readFile(t, filepath.Join(other, CACertFile))...)
	if err := os.WriteFile(f.CA, bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	after, err := p.For("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if after.RootCAs == before.RootCAs {
		t.Fatal("a changed CA file was not read again")
	}
	if body, err := get(t, addrA, after); err != nil || body != "node-b" {
		t.Fatalf("with the CA bundle: body %q, err %v", body, err)
	}

	if err := os.WriteFile(f.CA, []byte("not PEM\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = p.For("node-a")
	wantErr(t, err, f.CA)
	if body, err := get(t, addrA, before); err != nil || body != "node-b" {
		t.Fatalf("a configuration made before the CA broke: body %q, err %v", body, err)
	}
}
