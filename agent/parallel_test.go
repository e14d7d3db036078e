package agent

import (
	"time"

	"github.com/gpuherd/gpuherd/agent/names"
)

// clusterParallel is how many cluster tests run at once unless -parallel
// says otherwise. They spend most of their time waiting for gossip rounds,
// leases and registry elections, not computing: the default (one per CPU)
// left a 2-core machine idle for most of `go test ./agent`, and 6 still
// left it idle for two thirds of the run (`go test ./agent`: 42 s at 6,
// 26–34 s at 10). Under the race detector the same tests compute several
// times as long, and 6 keep both cores busy.
func clusterParallel() int {
	if raceDetector {
		return 6
	}
	return 10
}

// registriesFormFast gives the registries that socket clusters found by
// themselves (as in production) a founder that waits 200 ms for a steady
// membership, not 2 s, and heartbeat and election timeouts of half a
// second, half of production's (the leader lease stays production's):
// each whole-cluster test spent about three seconds waiting for its
// registry before. names.FastTiming's quarter second is too short here: on
// real sockets, with every package's tests running under -race, leaders
// stepped down for want of a quorum's answer within it.
func registriesFormFast() {
	registryTiming = func() names.Timing {
		t := names.LANTiming()
		t.Heartbeat, t.Election = 500*time.Millisecond, 500*time.Millisecond
		return t
	}
	foundingSettle = 200 * time.Millisecond
}
