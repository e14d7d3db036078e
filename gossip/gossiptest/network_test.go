package gossiptest

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// received reports whether t has a packet waiting, taking it.
func received(t *Transport) bool {
	select {
	case <-t.PacketCh():
		return true
	default:
		return false
	}
}

func TestFaultHooks(t *testing.T) {
	var n Network
	a, b, c := n.NewTransport(), n.NewTransport(), n.NewTransport()
	send := func(from, to *Transport) bool {
		if _, err := from.WriteTo([]byte("ping"), to.Addr()); err != nil {
			t.Fatalf("WriteTo: %v", err)
		}
		return received(to)
	}
	if !send(a, b) || !send(b, a) {
		t.Fatal("a healthy network lost a packet")
	}

	n.Block(a.Addr(), b.Addr())
	if send(a, b) {
		t.Error("a packet crossed a one-way block")
	}
	if !send(b, a) {
		t.Error("a one-way block stopped the other direction")
	}
	if _, err := a.DialTimeout(b.Addr(), 10*time.Millisecond); err == nil {
		t.Error("a dial crossed a one-way block")
	}

	n.Heal()
	n.Partition([]string{a.Addr()}, []string{b.Addr(), c.Addr()})
	if send(a, c) || send(c, a) || send(b, a) {
		t.Error("a packet crossed a partition")
	}
	if !send(b, c) {
		t.Error("a partition split one side")
	}

	n.Heal()
	n.Pause(c.Addr())
	if send(a, c) || send(c, a) {
		t.Error("a paused member sent or received")
	}
	n.Resume(c.Addr())
	if !send(a, c) {
		t.Error("a resumed member did not receive")
	}

	n.SetLoss(1, 7)
	if send(a, b) {
		t.Error("loss 1 delivered a packet")
	}
	n.Heal()

	n.SetDelay(20 * time.Millisecond)
	start := time.Now()
	if _, err := a.WriteTo([]byte("late"), b.Addr()); err != nil {
		t.Fatal(err)
	}
	<-b.PacketCh()
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Errorf("a delayed packet came after %v", waited)
	}
	n.Heal()

	n.Kill(b.Addr())
	if _, err := a.WriteTo([]byte("x"), b.Addr()); err == nil {
		t.Error("a write to a killed member succeeded")
	}
	if _, err := a.DialTimeout(b.Addr(), 10*time.Millisecond); err == nil {
		t.Error("a dial to a killed member succeeded")
	}
}

// Real memberlist members join over the network, and a partitioned member
// is declared failed by the others.
func TestMemberlistOverNetwork(t *testing.T) {
	var n Network
	var ms []*memberlist.Memberlist
	var addrs []string
	for i := range 3 {
		cfg := memberlist.DefaultLANConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		tr := n.NewTransport()
		cfg.Transport = tr
		cfg.LogOutput = io.Discard
		cfg.ProbeInterval = 50 * time.Millisecond
		cfg.ProbeTimeout = 20 * time.Millisecond
		cfg.SuspicionMult = 1
		m, err := memberlist.Create(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Shutdown() })
		ms = append(ms, m)
		addrs = append(addrs, tr.Addr())
	}
	if _, err := ms[1].Join(addrs[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := ms[2].Join(addrs[:1]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "three members everywhere", func() bool {
		return ms[0].NumMembers() == 3 && ms[1].NumMembers() == 3 && ms[2].NumMembers() == 3
	})
	n.Partition(addrs[2:], addrs[:2])
	waitFor(t, "m2 declared failed by m0", func() bool { return ms[0].NumMembers() == 2 })
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
