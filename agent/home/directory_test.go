package home

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// name is a member's name when the members are their names.
func name(s string) string { return s }

// Homes spread evenly over the servers, and a server leaving moves only
// the IDs it was home for.
func TestDirectoryHomesSpreadAndStay(t *testing.T) {
	const servers, ids = 50, 20000
	all := make([]string, servers)
	for i := range all {
		all[i] = fmt.Sprintf("gpu-%03d", i)
	}
	count := map[string]int{}
	home := map[string]string{}
	for i := range ids {
		id := fmt.Sprintf("vm-%d", i)
		h := Of(id, all, name)
		count[h]++
		home[id] = h
	}
	mean := ids / servers
	for _, m := range all {
		if n := count[m]; n < mean*7/10 || n > mean*13/10 {
			t.Errorf("%s is home for %d IDs; the mean is %d", m, n, mean)
		}
	}
	gone := all[7]
	rest := append(append([]string{}, all[:7]...), all[8:]...)
	moved := 0
	for id, h := range home {
		nh := Of(id, rest, name)
		switch {
		case h != gone && nh != h:
			t.Fatalf("%s moved from %s to %s although only %s left", id, h, nh, gone)
		case h == gone:
			moved++
		}
	}
	if moved != count[gone] {
		t.Errorf("%d IDs moved, %d were homed on %s", moved, count[gone], gone)
	}
}

// The home's record of one ID through its life: an intent, the owner's
// report, a release; a second coordinator sees the first one's intent; a
// stale intent is unsure, never "absent".
func TestDirectoryEntries(t *testing.T) {
	d := newDirectory(time.Unix(0, 0))
	now := time.Unix(100, 0)
	const ttl = time.Minute
	if _, ok := d.answer("vm-1", now, ttl); ok {
		t.Fatal("an empty directory answered")
	}
	d.entries["vm-1"] = &dirEntry{coordinator: "a", since: now}
	if ans, _ := d.answer("vm-1", now.Add(time.Second), ttl); ans.State != api.DirPending || ans.Coordinator != "a" {
		t.Errorf("during a's placement: %+v", ans)
	}
	if ans, _ := d.answer("vm-1", now.Add(2*ttl), ttl); ans.State != api.DirUnsure {
		t.Errorf("an intent older than its TTL: %+v, want unsure", ans)
	}
	// Another coordinator's abandon does not drop a's intent.
	d.apply("b", api.DirOp{ID: "vm-1", Op: api.DirOpAbandon}, now)
	if d.entries["vm-1"] == nil {
		t.Fatal("b's abandon dropped a's intent")
	}
	d.apply("owner-1", api.DirOp{ID: "vm-1", Op: api.DirOpHeld}, now)
	d.apply("owner-1", api.DirOp{ID: "vm-1", Op: api.DirOpHeld}, now) // a resync
	if ans, _ := d.answer("vm-1", now.Add(2*ttl), ttl); ans.State != api.DirHeld || len(ans.Owners) != 1 || ans.Owners[0] != "owner-1" {
		t.Errorf("after the commit: %+v", ans)
	}
	// A move: the new owner reports before the old one's release arrives.
	d.apply("owner-2", api.DirOp{ID: "vm-1", Op: api.DirOpHeld}, now)
	d.apply("owner-1", api.DirOp{ID: "vm-1", Op: api.DirOpGone}, now)
	if ans, _ := d.answer("vm-1", now, ttl); ans.State != api.DirHeld || len(ans.Owners) != 1 || ans.Owners[0] != "owner-2" {
		t.Errorf("after a move: %+v", ans)
	}
	d.apply("owner-2", api.DirOp{ID: "vm-1", Op: api.DirOpGone}, now)
	if _, ok := d.answer("vm-1", now, ttl); ok {
		t.Errorf("released claim still has an entry: %+v", d.entries["vm-1"])
	}
	// A coordinator that placed nothing drops its own intent.
	d.entries["vm-2"] = &dirEntry{coordinator: "a", since: now}
	d.apply("a", api.DirOp{ID: "vm-2", Op: api.DirOpAbandon}, now)
	if _, ok := d.answer("vm-2", now, ttl); ok {
		t.Error("an abandoned intent stayed")
	}
}
