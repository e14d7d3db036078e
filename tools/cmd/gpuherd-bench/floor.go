package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpuherd/gpuherd/agent/pki"
)

// floorResult is what no claim can beat on this machine.
type floorResult struct {
	rtt   durations // one HTTPS request with mutual TLS over loopback, warm connection
	fsync durations // one bbolt Update (it fsyncs) on a file of the data disk
}

// floor is two loopback round trips plus one fsync: the least a claim that
// reserves on another server's disk and commits there could cost.
func (f floorResult) floor() time.Duration { return 2*f.rtt.pct(50) + f.fsync.pct(50) }

func measureFloor(c *cluster, n int) (floorResult, error) {
	var res floorResult
	srvFiles, err := c.issue("floor-server")
	if err != nil {
		return res, err
	}
	cliFiles, err := c.issue("floor-client")
	if err != nil {
		return res, err
	}
	scfg, err := pki.ServerConfig(srvFiles)
	if err != nil {
		return res, err
	}
	ccfg, err := pki.ClientConfigFor(cliFiles, "floor-server")
	if err != nil {
		return res, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "{}") }),
		TLSConfig: scfg,
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()
	tr := &http.Transport{TLSClientConfig: ccfg, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	url := "https://" + ln.Addr().String() + "/"
	for i := range n + 20 {
		t0 := time.Now()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err != nil {
			return res, fmt.Errorf("floor round trip: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i >= 20 { // the first ones pay the handshake
			res.rtt = append(res.rtt, time.Since(t0))
		}
	}

	db, err := bolt.Open(filepath.Join(c.dir, "floor.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return res, err
	}
	defer db.Close()
	for i := range n / 4 {
		t0 := time.Now()
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("floor"))
			if err != nil {
				return err
			}
			return b.Put([]byte(fmt.Sprint(i%16)), []byte("a claim record of about this size, give or take"))
		})
		if err != nil {
			return res, err
		}
		res.fsync = append(res.fsync, time.Since(t0))
	}
	return res, nil
}
