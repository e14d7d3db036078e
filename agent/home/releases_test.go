package home

import (
	"slices"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The home keeps the latest release whatever order the notices arrive in
// (an owner re-sends what it remembers at every resync), and forgets it
// after remember_released.
func TestDirectoryRemembersTheLatestRelease(t *testing.T) {
	d := newDirectory(time.Unix(1000, 0))
	now := time.Unix(2000, 0)
	d.apply("b", api.DirOp{ID: "vm-1", Op: api.DirOpGone}, now)
	d.apply("a", api.DirOp{ID: "vm-1", Op: api.DirOpGone, At: now.Add(-time.Hour)}, now) // a's resync of an older release
	if got := d.lastOwner("vm-1", now, 24*time.Hour); got != "b" {
		t.Errorf("last owner = %q, want b (the latest release)", got)
	}
	d.apply("a", api.DirOp{ID: "vm-1", Op: api.DirOpGone, At: now.Add(time.Hour)}, now) // from the future: now
	if got := d.lastOwner("vm-1", now.Add(time.Minute), 24*time.Hour); got != "a" {
		t.Errorf("last owner = %q, want a", got)
	}
	if got := d.lastOwner("vm-1", now.Add(25*time.Hour), 24*time.Hour); got != "" {
		t.Errorf("after remember_released: %q, want forgotten", got)
	}
	if got := d.lastOwner("vm-1", now, 0); got != "" {
		t.Errorf("remember_released 0: %q, want nothing", got)
	}
}

// A release notice counts only from the server that holds the claim: one
// from another member (in its own name, all it can send now) neither
// removes the holder nor makes the sender the server the ID last ran on.
func TestHomeTakesReleasesOnlyFromTheHolder(t *testing.T) {
	d := newDirectory(time.Unix(0, 0))
	now := time.Unix(100, 0)
	d.apply("a", api.DirOp{ID: "vm-1", Op: api.DirOpHeld}, now)
	d.apply("intruder", api.DirOp{ID: "vm-1", Op: api.DirOpGone}, now.Add(time.Second))
	if ans, _ := d.answer("vm-1", now, time.Minute); ans.State != api.DirHeld || !slices.Equal(ans.Owners, []string{"a"}) {
		t.Errorf("after another member's release notice: %+v, want held on a", ans)
	}
	if last := d.lastOwner("vm-1", now.Add(2*time.Second), time.Hour); last != "" {
		t.Errorf("another member's release notice made %q the last owner", last)
	}
	d.apply("a", api.DirOp{ID: "vm-1", Op: api.DirOpGone}, now.Add(3*time.Second))
	if last := d.lastOwner("vm-1", now.Add(4*time.Second), time.Hour); last != "a" {
		t.Errorf("the holder's release: last owner %q, want a", last)
	}
}
