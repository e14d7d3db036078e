package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// syncCount is what a system asked of the disk: appends to a log, each one
// fdatasync (the registry's raft log; etcd's WAL), the fdatasyncs of the
// agents' ledgers (one per journal record, two per checkpoint into bbolt),
// and bbolt transactions, each two (its data pages, then its meta page:
// etcd's backend). The throughput test divides it by the claims made, to
// show how far group commit and raft's batching spread a sync over claims.
type syncCount struct {
	log, ledger, txn uint64
}

func (s syncCount) minus(o syncCount) syncCount {
	return syncCount{log: s.log - o.log, ledger: s.ledger - o.ledger, txn: s.txn - o.txn}
}

// total is the fdatasyncs the count stands for.
func (s syncCount) total() uint64 { return s.log + s.ledger + 2*s.txn }

// perClaim is the syncs per claim, with what they were: "" when nothing
// was counted.
func (s syncCount) perClaim(claims int) string {
	if claims == 0 || s.total() == 0 {
		return ""
	}
	n := float64(claims)
	parts := fmt.Sprintf("%.2f log", float64(s.log)/n)
	if s.ledger > 0 {
		parts += fmt.Sprintf(" + %.2f ledger", float64(s.ledger)/n)
	}
	if s.txn > 0 {
		parts += fmt.Sprintf(" + 2×%.2f txn", float64(s.txn)/n)
	}
	return fmt.Sprintf("%.2f (%s)", float64(s.total())/n, parts)
}

// syncs is every agent's: its ledger's fdatasyncs, and its copy of the
// name registry's raft store (a voter's).
func (c *cluster) syncs() syncCount {
	var s syncCount
	for _, nd := range c.nodes {
		s.ledger += nd.a.LedgerFdatasyncs()
		s.log += nd.a.RegistrySyncs()
	}
	return s
}

// syncs reads etcd's own counts from its metrics: WAL fsyncs, and backend
// (bbolt) commits.
func (e *etcdServer) syncs(ctx context.Context) (syncCount, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.endpoint+"/metrics", nil)
	if err != nil {
		return syncCount{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return syncCount{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return syncCount{}, fmt.Errorf("etcd metrics: %s", resp.Status)
	}
	return parseEtcdSyncs(bufio.NewScanner(resp.Body))
}

// parseEtcdSyncs takes the two counters out of etcd's metrics text.
func parseEtcdSyncs(sc *bufio.Scanner) (syncCount, error) {
	var (
		s            syncCount
		wal, backend bool
	)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *uint64
		switch name {
		case "etcd_disk_wal_fsync_duration_seconds_count":
			dst, wal = &s.log, true
		case "etcd_disk_backend_commit_duration_seconds_count":
			dst, backend = &s.txn, true
		default:
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return syncCount{}, fmt.Errorf("etcd metrics: %s: %w", name, err)
		}
		*dst = uint64(v)
	}
	if err := sc.Err(); err != nil {
		return syncCount{}, err
	}
	if !wal || !backend {
		return syncCount{}, fmt.Errorf("etcd metrics: no etcd_disk_wal_fsync_duration_seconds_count or etcd_disk_backend_commit_duration_seconds_count")
	}
	return s, nil
}
