package names

import (
	"errors"
	"testing"
	"time"
)

// List answers an owner's names and the lost ones, through any agent,
// linearizable or from a copy, and refuses a filter it cannot apply.
func TestClusterListByOwnerAndState(t *testing.T) {
	c := newCluster(t, 3, []string{"node-x"})
	leader := c.leader()
	follower := others(c.servers, leader)[0]
	ctx := ctxT(t, 10*time.Second)
	grant := func(id, owner string) {
		t.Helper()
		g, err := c.reg("node-x").Acquire(ctx, Claim(id), "node-x", "", "req-"+id, nil)
		if err != nil {
			t.Fatalf("acquire %s: %v", id, err)
		}
		if owner != "" {
			if _, err := c.reg(leader).Confirm(ctx, Claim(id), g.Record.Token, owner, nil); err != nil {
				t.Fatalf("confirm %s: %v", id, err)
			}
		}
	}
	grant("vm-a2", "gpu-a")
	grant("vm-a1", "gpu-a")
	grant("vm-b1", "gpu-b")
	grant("vm-p", "") // pending, placed by node-x
	if _, err := c.reg(leader).RemoveMember(ctx, "gpu-b"); err != nil {
		t.Fatal(err)
	}
	ids := func(l Listing) []string {
		var out []string
		for _, r := range l.Records {
			out = append(out, r.Name+"="+string(r.State))
		}
		return out
	}
	for _, via := range []string{"node-x", follower} {
		l, err := c.reg(via).List(ctx, Filter{Owner: "gpu-a"}, Linearizable)
		if got := ids(l); err != nil || len(got) != 2 || got[0] != "vm-a1=held" || got[1] != "vm-a2=held" {
			t.Fatalf("gpu-a's names through %s: %v, %v", via, got, err)
		}
		l, err = c.reg(via).List(ctx, Filter{Kind: KindClaim, State: StateLost}, Linearizable)
		if got := ids(l); err != nil || len(got) != 1 || got[0] != "vm-b1=lost" || l.Records[0].Owner != "gpu-b" {
			t.Fatalf("lost names through %s: %v, %v", via, got, err)
		}
	}
	c.caughtUp(t, follower)
	l, err := c.reg(follower).List(ctx, Filter{State: StatePending}, Stale)
	if got := ids(l); err != nil || len(got) != 1 || got[0] != "vm-p=pending" {
		t.Fatalf("stale list of pending names: %v, %v", got, err)
	}
	if _, err := c.reg("node-x").List(ctx, Filter{State: StateReleased}, Linearizable); !errors.Is(err, ErrInvalid) {
		t.Fatalf("list of released names: %v, want invalid", err)
	}
	if l, err := c.reg(leader).List(ctx, Filter{Owner: "gpu-c"}, Linearizable); err != nil || len(l.Records) != 0 || l.Truncated {
		t.Fatalf("names of a server holding none: %+v, %v", l, err)
	}
}

func TestFSMListIsBounded(t *testing.T) {
	f := NewFSM(nil)
	for i, id := range []string{"c", "a", "b"} {
		f.st.put(Record{Kind: KindClaim, Name: id, Owner: "gpu-a", State: StateHeld, Token: uint64(i + 1)})
	}
	recs, more, err := f.List(Filter{Owner: "gpu-a"}, 2)
	if err != nil || !more || len(recs) != 2 || recs[0].Name != "a" || recs[1].Name != "b" {
		t.Fatalf("bounded list: %+v, %v, %v", recs, more, err)
	}
}
