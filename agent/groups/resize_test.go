package groups

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

func TestNodesOffNamesEveryNodeNotAsItWas(t *testing.T) {
	l1 := []api.Item{{Model: "L40S", Count: 1}}
	l2 := []api.Item{{Model: "L40S", Count: 2}}
	before := map[string]api.Claim{
		"g.node-0": {Node: "a", Items: l1},
		"g.node-1": {Node: "a", Items: l1},
		"g.node-2": {Node: "b", Items: l1},
		"g.node-3": {Node: "b", Items: l1},
	}
	now := map[string]api.Claim{
		"g.node-0": {Node: "a", Items: l1}, // as it was
		"g.node-1": {Node: "b", Items: l1}, // moved
		"g.node-2": {Node: "b", Items: l2}, // resized
		"g.node-4": {Node: "a", Items: l2}, // was missing
	}
	ids := []string{"g.node-0", "g.node-1", "g.node-2", "g.node-3", "g.node-4", "g.node-5"}
	off := nodesOff(ids, before, now, map[string]error{"g.node-5": errors.New("c did not answer")})
	want := []string{"g.node-1", "g.node-2", "g.node-3", "g.node-4", "g.node-5"}
	if len(off) != len(want) {
		t.Fatalf("off: %q", off)
	}
	for i, id := range want {
		if !strings.HasPrefix(off[i], id+" ") {
			t.Errorf("off[%d] = %q, want %s", i, off[i], id)
		}
	}
}
