package ledger

import (
	"fmt"
	"testing"
)

// BenchmarkReserveCommit measures one claim's round trip on a real file
// with fsync: Reserve, Commit, and the Release that makes room for the next
// iteration — three durable transactions per op, the cost a coordinator
// pays on the owner.
func BenchmarkReserveCommit(b *testing.B) {
	l := newLedger(b)
	r := req(Item{h100, 2})
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("vm-%d", i)
		i++
		if _, err := l.Reserve(id, r, "coord", t0, lease); err != nil {
			b.Fatal(err)
		}
		if _, err := l.Commit(id, t0); err != nil {
			b.Fatal(err)
		}
		if _, err := l.Release(id, t0); err != nil {
			b.Fatal(err)
		}
	}
}
