package agent

import (
	"flag"
	"runtime"
	"strconv"
)

// clusterParallel is how many cluster tests run at once unless -parallel
// says otherwise. They spend most of their time waiting for gossip rounds,
// leases and registry elections, not computing: the default (one per CPU)
// left a 2-core machine idle for most of `go test ./agent`.
const clusterParallel = 6

// waitersRunTogether raises -test.parallel to clusterParallel when the
// command line did not set it.
func waitersRunTogether() {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < clusterParallel {
		if err := flag.Set("test.parallel", strconv.Itoa(clusterParallel)); err != nil {
			panic(err)
		}
	}
}
