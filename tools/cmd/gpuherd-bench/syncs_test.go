package main

import (
	"bufio"
	"strings"
	"testing"
)

// etcd's metrics give its WAL fsyncs and backend commits; a text without
// either is an error, not zero syncs.
func TestParseEtcdSyncs(t *testing.T) {
	text := `# HELP etcd_disk_wal_fsync_duration_seconds The latency distributions of fsync called by WAL.
# TYPE etcd_disk_wal_fsync_duration_seconds histogram
etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 3000
etcd_disk_wal_fsync_duration_seconds_sum 1.5
etcd_disk_wal_fsync_duration_seconds_count 4123
etcd_disk_backend_commit_duration_seconds_sum 0.2
etcd_disk_backend_commit_duration_seconds_count 57
`
	s, err := parseEtcdSyncs(bufio.NewScanner(strings.NewReader(text)))
	if err != nil || s != (syncCount{log: 4123, txn: 57}) {
		t.Fatalf("parsed %+v, %v; want 4123 WAL fsyncs and 57 backend commits", s, err)
	}
	if got := s.perClaim(100); got != "42.37 (41.23 log + 2×0.57 txn)" {
		t.Errorf("per claim: %q", got)
	}
	if got := (syncCount{log: 191, ledger: 203}).perClaim(100); got != "3.94 (1.91 log + 2.03 ledger)" {
		t.Errorf("gpuherd's per claim: %q", got)
	}
	if _, err := parseEtcdSyncs(bufio.NewScanner(strings.NewReader("etcd_disk_wal_fsync_duration_seconds_count 4\n"))); err == nil {
		t.Error("metrics without the backend's commits parsed")
	}
}
