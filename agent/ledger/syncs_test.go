package ledger

import (
	"testing"
)

// TestSyncsCountsEveryCommittedWrite: Syncs moves by exactly as many as
// bbolt's committed transactions on the file, for every kind of write,
// and not at all for what touches memory only or changes nothing.
func TestSyncsCountsEveryCommittedWrite(t *testing.T) {
	l := newLedger(t)
	steps := []struct {
		name string
		do   func() error
		want uint64
	}{
		{"Reserve", func() error {
			_, err := l.Reserve("vm-1", req(Item{Model: h100, Count: 2}), "coord", t0, lease)
			return err
		}, 0},
		{"Commit", func() error { _, err := l.Commit("vm-1", t0); return err }, 1},
		{"Commit again", func() error { _, err := l.Commit("vm-1", t0); return err }, 0},
		{"Release", func() error { _, err := l.Release("vm-1", t0); return err }, 1},
		{"Remember", func() error { return l.Remember(Claim{ID: "vm-1", State: StateCommitted}, t0, lease) }, 1},
		{"PutFacts", func() error { return l.PutFacts("0000:18:00.0", []byte(`{"uuid":"GPU-1"}`)) }, 1},
		{"PutFacts unchanged", func() error { return l.PutFacts("0000:18:00.0", []byte(`{"uuid":"GPU-1"}`)) }, 0},
		{"Drain", func() error { return l.Drain("0000:9a:00.0", "fan", t0) }, 1},
		{"Drain unchanged", func() error { return l.Drain("0000:9a:00.0", "fan", t0) }, 0},
	}
	for _, s := range steps {
		tx0, syncs0 := markFile(t, l).txid, l.Syncs()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		tx, syncs := markFile(t, l).txid, l.Syncs()
		if got := syncs - syncs0; got != s.want || int(got) != tx-tx0 {
			t.Errorf("%s: Syncs moved by %d, the file's transactions by %d; want %d", s.name, got, tx-tx0, s.want)
		}
	}
}
