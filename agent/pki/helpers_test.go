package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const year = 365 * 24 * time.Hour

// cluster is a CA with certificates for node-a and node-b, both carrying
// 127.0.0.1, as "gpuherd tls" would make them.
type cluster struct {
	caDir, nodeDir string
}

func newCluster(t testing.TB) cluster {
	t.Helper()
	c := cluster{caDir: filepath.Join(t.TempDir(), "ca"), nodeDir: filepath.Join(t.TempDir(), "nodes")}
	if err := CreateCA(c.caDir, "test CA", 2*year); err != nil {
		t.Fatalf("CreateCA: %v", err)
	}
	for _, n := range []string{"node-a", "node-b"} {
		c.issue(t, n)
	}
	return c
}

func (c cluster) issue(t testing.TB, node string) {
	t.Helper()
	if err := IssueCert(c.caDir, c.nodeDir, node, []string{"127.0.0.1", "localhost"}, year); err != nil {
		t.Fatalf("IssueCert %s: %v", node, err)
	}
}

func (c cluster) files(node string) Files {
	cert, key := NodeFiles(c.nodeDir, node)
	return Files{CA: filepath.Join(c.caDir, CACertFile), Cert: cert, Key: key}
}

// serve runs an HTTPS server on 127.0.0.1 with cfg that answers with the
// caller's node name. The TLS listener is wrapped by hand rather than with
// StartTLS, because StartTLS adds httptest's own certificate to the config,
// and Go serves that one instead of GetCertificate's to a client that sends
// no SNI, which is every client dialling an IP address.
func serve(t *testing.T, cfg *tls.Config) (addr string, calls *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		name, err := PeerName(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		io.WriteString(w, name)
	}))
	// Handshake failures are what several tests provoke; keep them quiet.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Listener = tls.NewListener(srv.Listener, cfg)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), &n
}

// get makes one HTTPS request with cfg and returns the body.
func get(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status + ": " + string(b))
	}
	return string(b), nil
}

// refused dials addr with cfg and returns the error that ends the
// connection. In TLS 1.3 the client finishes its half before the server has
// judged the client certificate, so the server's verdict arrives as an alert
// on the first read. Nothing is written first: unread data at the server
// would turn its close into a reset that can hide the alert.
func refused(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("server accepted the connection (read timed out instead of failing)")
	}
	return err
}

// peerCert dials addr with cfg and returns the server's leaf certificate.
func peerCert(t *testing.T, addr string, cfg *tls.Config) *x509.Certificate {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not contain %q", err, p)
		}
	}
}
