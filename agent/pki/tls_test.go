package pki

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMutualTLSAcceptsNodeOfTheCA(t *testing.T) {
	c := newCluster(t)
	srvCfg, err := ServerConfig(c.files("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	if srvCfg.MinVersion != tls.VersionTLS13 || srvCfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("server config: MinVersion %x ClientAuth %v, want TLS 1.3 and RequireAndVerifyClientCert", srvCfg.MinVersion, srvCfg.ClientAuth)
	}
	addr, calls := serve(t, srvCfg)

	// By node name, at an address the certificate need not carry.
	forA, err := ClientConfigFor(c.files("node-b"), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	body, err := get(t, addr, forA)
	if err != nil {
		t.Fatalf("node-b → node-a with ClientConfigFor: %v", err)
	}
	if body != "node-b" {
		t.Fatalf("server saw peer %q, want node-b", body)
	}

	// By address, which the certificate carries as an IP SAN.
	plain, err := ClientConfig(c.files("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	if body, err := get(t, addr, plain); err != nil || body != "node-b" {
		t.Fatalf("node-b → node-a with ClientConfig: body %q, err %v", body, err)
	}
	if got := calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2", got)
	}
}

func TestServerRefusesClient(t *testing.T) {
	c := newCluster(t)
	other := newCluster(t) // a second CA with its own node-b
	srvCfg, err := ServerConfig(c.files("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	addr, calls := serve(t, srvCfg)

	pool, err := loadCAPool(c.files("node-a").CA, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.LoadX509KeyPair(other.files("node-b").Cert, other.files("node-b").Key)
	if err != nil {
		t.Fatal(err)
	}
	// An expired certificate of the right CA, presented as-is: ClientConfig
	// would already refuse to load it.
	old := newBackdatedCluster(t)
	oldSrv, err := ServerConfig(old.files("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	oldAddr, oldCalls := serve(t, oldSrv)
	expired, err := tls.LoadX509KeyPair(old.files("expired").Cert, old.files("expired").Key)
	if err != nil {
		t.Fatal(err)
	}
	oldPool, err := loadCAPool(old.files("node-a").CA, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		addr string
		cfg  *tls.Config
		want string
	}{
		{"no certificate", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}, "certificate required"},
		{"certificate of another CA", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{foreign}}, "unknown certificate authority"},
		{"expired certificate", oldAddr, &tls.Config{RootCAs: oldPool, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{expired}}, "expired certificate"},
		{"TLS 1.2", addr, &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12}, "protocol version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, refused(t, tc.addr, tc.cfg), tc.want)
		})
	}
	if n := calls.Load() + oldCalls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for refused clients", n)
	}
}

// newBackdatedCluster has a CA made three days ago, a valid node-a and a
// node certificate "expired" that was valid for one day two days ago.
func newBackdatedCluster(t *testing.T) cluster {
	t.Helper()
	c := cluster{caDir: filepath.Join(t.TempDir(), "ca"), nodeDir: filepath.Join(t.TempDir(), "nodes")}
	past := time.Now().Add(-3 * 24 * time.Hour)
	if err := createCA(c.caDir, "old CA", past, 2*year); err != nil {
		t.Fatal(err)
	}
	c.issue(t, "node-a")
	if err := issueCert(c.caDir, c.nodeDir, "expired", []string{"127.0.0.1"}, time.Now().Add(-2*24*time.Hour), 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientRefusesServer(t *testing.T) {
	c := newCluster(t)
	other := newCluster(t)
	srvCfg, err := ServerConfig(c.files("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	addr, calls := serve(t, srvCfg)
	otherSrv, err := ServerConfig(other.files("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	otherAddr, otherCalls := serve(t, otherSrv)

	wrongNode, err := ClientConfigFor(c.files("node-b"), "node-c")
	if err != nil {
		t.Fatal(err)
	}
	_, err = get(t, addr, wrongNode)
	wantErr(t, err, `reached node "node-a", expected "node-c"`)

	// Same node name, but a node of another cluster.
	forA, err := ClientConfigFor(c.files("node-b"), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = get(t, otherAddr, forA)
	wantErr(t, err, `certificate of peer "node-a"`, "unknown authority")

	plain, err := ClientConfig(c.files("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = get(t, otherAddr, plain)
	wantErr(t, err, "unknown authority")

	if n := calls.Load() + otherCalls.Load(); n != 0 {
		t.Fatalf("handler ran %d times though every client gave up", n)
	}

	if _, err := ClientConfigFor(c.files("node-b"), "Node A"); err == nil {
		t.Fatal("ClientConfigFor accepted an invalid expected node name")
	}
}

func TestConfigErrorsNameTheFile(t *testing.T) {
	c := newCluster(t)
	other := newCluster(t)
	good := c.files("node-a")
	missing := filepath.Join(t.TempDir(), "nope.key")
	for _, tc := range []struct {
		name string
		f    Files
		want []string
	}{
		{"CA not set", Files{Cert: good.Cert, Key: good.Key}, []string{"tls_ca is not set"}},
		{"key not set", Files{CA: good.CA, Cert: good.Cert}, []string{"tls_key is not set"}},
		{"missing key", Files{CA: good.CA, Cert: good.Cert, Key: missing}, []string{missing, "does not exist"}},
		{"missing CA", Files{CA: missing, Cert: good.Cert, Key: good.Key}, []string{"CA certificate " + missing, "does not exist"}},
		{"key of another node", Files{CA: good.CA, Cert: good.Cert, Key: c.files("node-b").Key}, []string{"does not match certificate " + good.Cert}},
		{"certificate of another CA", Files{CA: good.CA, Cert: other.files("node-a").Cert, Key: other.files("node-a").Key}, []string{other.files("node-a").Cert, "is not valid under CA " + good.CA}},
		{"node certificate as CA", Files{CA: good.Cert, Cert: good.Cert, Key: good.Key}, []string{"is not a CA certificate"}},
		{"key as certificate", Files{CA: good.CA, Cert: good.Key, Key: good.Key}, []string{good.Key, "holds no PEM certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ServerConfig(tc.f)
			wantErr(t, err, tc.want...)
			_, err = ClientConfigFor(tc.f, "node-x")
			wantErr(t, err, tc.want...)
		})
	}
}

func TestExpiredCertificateNamesFileAndDates(t *testing.T) {
	c := newBackdatedCluster(t)
	f := c.files("expired")
	_, err := ServerConfig(f)
	wantErr(t, err, "certificate "+f.Cert+" expired on", "valid ", " to ", "issue a new one")

	// The clock is injectable: a node certificate valid today is expired
	// in two years, and the CA with it.
	later := func() time.Time { return time.Now().Add(2 * year) }
	_, err = ClientConfig(c.files("node-a"), WithClock(later))
	wantErr(t, err, "CA certificate", "expired on")
}

func TestPeerNameWithoutTLS(t *testing.T) {
	if _, err := PeerName(httptest.NewRequest("GET", "/", nil)); err == nil {
		t.Fatal("PeerName of a plain HTTP request returned no error")
	}
}

func TestReloadOnRotation(t *testing.T) {
	c := newCluster(t)
	f := c.files("node-a")
	var logs lockedBuffer
	srvCfg, err := ServerConfig(f, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, srvCfg)
	forA, err := ClientConfigFor(c.files("node-b"), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	first := peerCert(t, addr, forA)

	rotate := func() {
		t.Helper()
		for _, p := range []string{f.Cert, f.Key} {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
		c.issue(t, "node-a")
	}
	rotate()
	second := peerCert(t, addr, forA)
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("server still presents the old certificate after rotation")
	}

	// A half-done rotation (the new certificate, the old key) keeps the
	// last good pair in service rather than failing every handshake.
	prevKey, err := os.ReadFile(f.Key)
	if err != nil {
		t.Fatal(err)
	}
	rotate()
	if err := os.WriteFile(f.Key, prevKey, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := peerCert(t, addr, forA); got.SerialNumber.Cmp(second.SerialNumber) != 0 {
			t.Fatal("a mismatched pair replaced the certificate in service")
		}
	}
	if n := strings.Count(logs.String(), "cannot be used"); n != 1 {
		t.Fatalf("the bad pair was reported %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "does not match certificate") {
		t.Fatalf("the warning does not say what is wrong:\n%s", logs.String())
	}

	// Finishing the rotation takes effect at the next handshake.
	rotate()
	if got := peerCert(t, addr, forA); got.SerialNumber.Cmp(second.SerialNumber) == 0 {
		t.Fatal("server did not pick up the completed rotation")
	}
}

// lockedBuffer collects log output written from server goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
