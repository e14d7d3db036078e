package claim

import (
	"testing"

	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

func TestBusyWhenMostOfAModelIsTaken(t *testing.T) {
	server := func(free, healthy int) Target {
		return Target{caps: map[string]ledger.ModelTotals{"L40S": {Total: healthy, Free: free, Healthy: healthy}}}
	}
	l40s := []placement.Want{{Model: "L40S", Count: 1}}
	for _, c := range []struct {
		servers []Target
		want    bool
	}{
		{[]Target{server(4, 4), server(4, 4)}, false},
		{[]Target{server(3, 4), server(2, 4)}, false}, // 3 of 8 taken
		{[]Target{server(2, 4), server(2, 4)}, true},  // 4 of 8: half
		{[]Target{server(0, 4), server(0, 0)}, true},
		{[]Target{server(0, 0)}, false}, // no such GPU anywhere: nothing to probe
	} {
		if got := busy(c.servers, l40s); got != c.want {
			t.Errorf("busy(%v) = %v, want %v", c.servers, got, c.want)
		}
	}
	// Another model's load does not count.
	if busy([]Target{server(0, 4)}, []placement.Want{{Model: "H100", Count: 1}}) {
		t.Error("busy for a model no server has")
	}
}
