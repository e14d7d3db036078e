package home

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// members is a fake Membership: a cluster this agent has joined (or not)
// with the given peers.
type members struct {
	joined bool
	peers  []string
}

func (m *members) Joined() bool    { return m.joined }
func (m *members) Peers() []string { return m.peers }

const (
	settle     = 10 * time.Second
	pendingTTL = time.Minute
)

// newHome is the home of agent "a" in a joined cluster with peers, on a
// manual clock.
func newHome(peers ...string) (*Home, *clock.Manual, *members) {
	clk := clock.NewManual(time.Unix(1_000_000, 0))
	m := &members{joined: true, peers: peers}
	h := New(Deps{
		NodeName:         "a",
		Clock:            clk,
		Members:          m,
		DirectorySettle:  settle,
		RememberReleased: 24 * time.Hour,
		PendingTTL:       pendingTTL,
	})
	return h, clk, m
}

func isCode(err error, code string) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}

// Bad notifications are refused whole, naming what is wrong.
func TestDirectoryRejectsBadUpdates(t *testing.T) {
	h, _, _ := newHome()
	ctx := context.Background()
	for _, u := range []api.DirUpdate{
		{From: "", Ops: []api.DirOp{{ID: "vm-1", Op: api.DirOpHeld}}},
		{From: "b c", Ops: []api.DirOp{{ID: "vm-1", Op: api.DirOpHeld}}},
		{From: "b", Ops: []api.DirOp{{ID: "vm-1", Op: api.DirOpHeld}, {ID: "../x", Op: api.DirOpHeld}}},
		{From: "b", Ops: []api.DirOp{{ID: "vm-1", Op: "steal"}}},
		{From: "b", Ops: make([]api.DirOp, api.MaxDirUpdateIDs+1)},
	} {
		if err := h.UpdateDirectory(ctx, u); !isCode(err, api.CodeInvalid) {
			t.Errorf("update %+v: %v, want invalid", u.From, err)
		}
	}
	if st := h.Stats(); st.Entries != 0 {
		t.Errorf("a refused update changed the directory: %v", h.dir.entries)
	}
}
