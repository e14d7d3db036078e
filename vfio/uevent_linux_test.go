package vfio

import (
	"context"
	"testing"
	"time"
)

// TestNetlinkUeventsOpenAndStop: the real source opens the kernel's
// uevent socket (listening needs no privilege) and closes its channel once
// the context ends. Real PCI events are the QEMU guest's business (make
// test-kernel): this test must never cause one on the host.
func TestNetlinkUeventsOpenAndStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := NetlinkUevents{}.WatchPCI(ctx)
	if err != nil {
		t.Skipf("no uevent netlink socket here: %v", err)
	}
	cancel()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the channel stayed open after the context ended")
		}
	}
}
