package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpuherd/gpuherd/agent/placement"
)

// etcdServer is /usr/bin/etcd (Debian's etcd-server) on loopback with a
// data dir of its own: one member, WAL fsync on, as a platform would run it
// (minus the three-member quorum, which only adds round trips).
type etcdServer struct {
	cmd      *exec.Cmd
	endpoint string
	dir      string
}

func startEtcd(bin, dir string) (*etcdServer, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("etcd not found at %s (apt-get install etcd-server): %w", bin, err)
	}
	cport, err := freePort()
	if err != nil {
		return nil, err
	}
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(cport)
	peer := "http://127.0.0.1:" + strconv.Itoa(pport)
	data := filepath.Join(dir, "etcd")
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--name", "bench", "--data-dir", data,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	e := &etcdServer{cmd: cmd, endpoint: "127.0.0.1:" + strconv.Itoa(cport), dir: data}
	cli, err := e.client()
	if err != nil {
		e.stop()
		return nil, err
	}
	defer cli.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Put(ctx, "/gpuherd/ping", "1")
		cancel()
		if err == nil {
			return e, nil
		}
		if time.Now().After(deadline) {
			e.stop()
			return nil, fmt.Errorf("etcd did not answer within 20s (see %s): %w", logf.Name(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *etcdServer) client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{e.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

func (e *etcdServer) stop() {
	if e.cmd.Process != nil {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = e.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = e.cmd.Process.Kill()
			<-done
		}
	}
}

// etcdAlloc is the central allocator a good platform builds on etcd: one
// key per server holding its free GPUs per model; a claim reads the servers
// (one linearizable range read), ranks them best fit (the same ranking as
// the agents), and writes in one transaction that compares the chosen
// server's ModRevision — Placement's generation scheme — retrying from the
// read on a conflict.
type etcdAlloc struct {
	cli       *clientv3.Client
	conflicts atomic.Int64
}

const (
	etcdServers = "/gpuherd/servers/"
	etcdClaims  = "/gpuherd/claims/"
)

func newEtcdAlloc(cli *clientv3.Client, capa capacity) (*etcdAlloc, error) {
	ctx := context.Background()
	if _, err := cli.Delete(ctx, "/gpuherd/", clientv3.WithPrefix()); err != nil {
		return nil, err
	}
	for s, ms := range capa {
		b, _ := json.Marshal(ms)
		if _, err := cli.Put(ctx, etcdServers+s, string(b)); err != nil {
			return nil, err
		}
	}
	return &etcdAlloc{cli: cli}, nil
}

func (*etcdAlloc) name() string { return "etcd central (best fit, txn on ModRevision)" }

func (e *etcdAlloc) retries() int64 { return e.conflicts.Load() }

type etcdEntry struct {
	free map[string]int
	rev  int64
}

func (e *etcdAlloc) read(ctx context.Context) (map[string]etcdEntry, error) {
	resp, err := e.cli.Get(ctx, etcdServers, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make(map[string]etcdEntry, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var free map[string]int
		if err := json.Unmarshal(kv.Value, &free); err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(string(kv.Key), etcdServers)] = etcdEntry{free: free, rev: kv.ModRevision}
	}
	return out, nil
}

func (e *etcdAlloc) claim(ctx context.Context, rnd *rand.Rand, id, model string, count int) (string, error) {
	for attempt := 0; attempt < 50; attempt++ {
		state, err := e.read(ctx)
		if err != nil {
			return "", err
		}
		servers := make([]placement.Server, 0, len(state))
		for s, en := range state {
			servers = append(servers, placement.Server{Name: s, Free: en.free})
		}
		slices.SortFunc(servers, func(a, b placement.Server) int { return cmpName(a.Name, b.Name) })
		ranked := bestFit(servers, []placement.Want{{Model: model, Count: count}}, rnd)
		if len(ranked) == 0 {
			return "", errRefused
		}
		s := ranked[0]
		en := state[s]
		en.free[model] -= count
		b, _ := json.Marshal(en.free)
		rec := fmt.Sprintf("%s|%s|%d", s, model, count)
		resp, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(etcdServers+s), "=", en.rev)).
			Then(clientv3.OpPut(etcdServers+s, string(b)), clientv3.OpPut(etcdClaims+id, rec)).
			Commit()
		if err != nil {
			return "", err
		}
		if resp.Succeeded {
			return s, nil
		}
		e.conflicts.Add(1)
	}
	return "", fmt.Errorf("claim %s: too many conflicts", id)
}

func (e *etcdAlloc) release(ctx context.Context, id, _ string) error {
	resp, err := e.cli.Get(ctx, etcdClaims+id)
	if err != nil || len(resp.Kvs) == 0 {
		return err
	}
	parts := strings.Split(string(resp.Kvs[0].Value), "|")
	s, model := parts[0], parts[1]
	count, _ := strconv.Atoi(parts[2])
	for attempt := 0; attempt < 50; attempt++ {
		r, err := e.cli.Get(ctx, etcdServers+s)
		if err != nil || len(r.Kvs) == 0 {
			return err
		}
		var free map[string]int
		if err := json.Unmarshal(r.Kvs[0].Value, &free); err != nil {
			return err
		}
		free[model] += count
		b, _ := json.Marshal(free)
		tr, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(etcdServers+s), "=", r.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(etcdServers+s, string(b)), clientv3.OpDelete(etcdClaims+id)).
			Commit()
		if err != nil {
			return err
		}
		if tr.Succeeded {
			return nil
		}
		e.conflicts.Add(1)
	}
	return fmt.Errorf("release %s: too many conflicts", id)
}
