package agent

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/pki"
)

// TestIntegrationSlowBodiesAreCutOff: a client that sends a request's
// headers and then only part of its body loses the connection once the
// read deadline has passed, on the local socket and on the peer API alike
// (a peer API without a read deadline kept such a connection open for
// ever).
func TestIntegrationSlowBodiesAreCutOff(t *testing.T) {
	tc := newSocketCluster(t)
	tc.opts = []Option{WithRequestReadTimeout(300 * time.Millisecond)}
	a := tc.start("owner", "l40s-4")

	// The local socket.
	c, err := net.Dial("unix", a.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	checkCutOff(t, "local socket", c)

	// The peer API, with a certificate of the cluster's CA: the deadline
	// holds for clients that may talk to it, not only for strangers.
	caDir := filepath.Join(tc.dir, "ca")
	if err := pki.IssueCert(caDir, filepath.Join(tc.dir, "certs"), "slow-client", []string{"127.0.0.1"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(tc.dir, "certs", "slow-client.crt"), filepath.Join(tc.dir, "certs", "slow-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(caDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tlsConn, err := tls.Dial("tcp", a.cluster.peerAddr, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert},
		ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	checkCutOff(t, "peer API", tlsConn)
}

// checkCutOff sends headers announcing 1000 bytes of body, then 10, and
// waits: the server must answer or close within a few read timeouts.
func checkCutOff(t *testing.T, where string, c net.Conn) {
	t.Helper()
	defer c.Close()
	const req = "PUT /v1/claims/vm-slow HTTP/1.1\r\nHost: gpuherd\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"gpus\":["
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	took := time.Since(start)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: the connection was still open after %s of a stalled body", where, took.Round(time.Millisecond))
	}
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("%s: a stalled body was served: %d", where, resp.StatusCode)
		}
	}
	if took > 5*time.Second {
		t.Fatalf("%s: cut off only after %s", where, took)
	}
	t.Logf("%s: a stalled body was cut off after %s (status or error: %v)", where, took.Round(time.Millisecond), describe(resp, err))
}

func describe(resp *http.Response, err error) any {
	if err != nil {
		return err
	}
	return resp.Status
}
