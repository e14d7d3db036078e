package main

import (
	"maps"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The oracle and the etcd allocator get what a server can hand out, not
// all its GPUs: the mixed profile's L40S that cannot be passed through
// is no capacity (with it, both placed ten L40S the agents never had).
func TestCapacityIsWhatCanBeHandedOut(t *testing.T) {
	m := api.Member{Name: "gpu004", Models: []api.ModelAvailability{
		{Model: "NVIDIA H100 80GB", Free: 2, Total: 2, Healthy: 2},
		{Model: "NVIDIA L40S", Free: 1, Total: 2, Healthy: 1, Unusable: 1},
		{Model: "NVIDIA RTX 6000 Pro", Free: 0, Total: 1, Healthy: 1},
	}}
	want := map[string]int{"NVIDIA H100 80GB": 2, "NVIDIA L40S": 1, "NVIDIA RTX 6000 Pro": 1}
	if got := usable(m); !maps.Equal(got, want) {
		t.Fatalf("usable = %v; want %v", got, want)
	}
}
