package agent

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// pauseAt makes x's group operations stop before they change node, once,
// until the returned release is called; reached is closed when one does.
func pauseAt(x *Agent, node string) (reached <-chan struct{}, release func()) {
	r, g := make(chan struct{}), make(chan struct{})
	var once sync.Once
	x.onGroupStep = func(_, n string) {
		if n != node {
			return
		}
		once.Do(func() {
			close(r)
			<-g
		})
	}
	return r, sync.OnceFunc(func() { close(g) })
}

// nodeClaims lists, from every ledger, the claims of group's nodes.
func nodeClaims(t *testing.T, ag []*Agent, group string) []string {
	t.Helper()
	var out []string
	for _, x := range ag {
		cs, err := x.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if strings.HasPrefix(c.ID, group+".node-") {
				out = append(out, c.ID+"@"+c.Node+"["+api.DescribeItems(c.Items)+"]")
			}
		}
	}
	return out
}

// A create whose client gave up, still running on its agent (frozen, cut
// off), while the client's next operation deletes the group through
// another agent: the old create must not place its remaining nodes for a
// group that no longer exists. Without the group fence it places node-1
// after the delete, and that claim is never released.
func TestGroupCreateOvertakenByDelete(t *testing.T) {
	_, _, ag := namedAgents(t, nil, "l40s-4", "l40s-4")
	a, b := ag[0], ag[1]
	ctx := context.Background()
	reached, release := pauseAt(a, "pool.node-1")
	defer release()
	created := make(chan error, 1)
	go func() {
		_, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: []api.Item{{Model: "L40S", Count: 1}}})
		created <- err
	}()
	<-reached // node-0 placed, node-1 next
	g, err := b.DeleteGroupClaims(ctx, "pool")
	if err != nil {
		t.Fatalf("delete while the create is paused: %v", err)
	}
	if len(g.Claims) != 1 {
		t.Fatalf("delete released %v, want node-0", nodeServers(g))
	}
	release()
	err = <-created
	if e := apiErr(t, err); e.Code != api.CodeNotFound || !strings.Contains(e.Message, "deleted while this operation ran") {
		t.Fatalf("the overtaken create answered %+v", e)
	}
	if left := nodeClaims(t, ag, "pool"); len(left) != 0 {
		t.Fatalf("the deleted group's nodes are held: %v", left)
	}
}

// A resize still running on its agent while a newer resize of the same
// group (a client's retry, through another agent, with another request)
// completes: the old one must stop, not change the nodes the newer one
// left, nor put back those it changed itself. Without the fence the group
// ends with nodes of both requests.
func TestGroupResizeOvertakenByANewerResize(t *testing.T) {
	_, _, ag := namedAgents(t, nil, "l40s-4", "l40s-4")
	a, b := ag[0], ag[1]
	ctx := context.Background()
	one := []api.Item{{Model: "L40S", Count: 1}}
	if _, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: one}); err != nil {
		t.Fatal(err)
	}
	reached, release := pauseAt(a, "pool.node-1")
	defer release()
	resized := make(chan error, 1)
	go func() {
		_, err := a.ResizeGroup(ctx, "pool", api.ResizeRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}})
		resized <- err
	}()
	<-reached // node-0 has two L40S, node-1 is next
	g, err := b.ResizeGroup(ctx, "pool", api.ResizeRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if err != nil {
		t.Fatalf("the newer resize: %v", err)
	}
	want := api.DescribeItems(g.GPUs)
	release()
	err = <-resized
	if e := apiErr(t, err); e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "changed by a newer operation") {
		t.Fatalf("the overtaken resize answered %+v", e)
	}
	after, err := b.GetGroup(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Claims) != 2 {
		t.Fatalf("group after both resizes: %v, missing %v", nodeServers(after), after.Missing)
	}
	for _, c := range after.Claims {
		if got := api.DescribeItems(c.Items); got != want {
			t.Errorf("%s holds %s, want %s (the newer resize's)", c.ID, got, want)
		}
	}
}
