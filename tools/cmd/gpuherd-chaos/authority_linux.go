package main

import (
	"bufio"
	"bytes"
	"os"
	"strings"

	"github.com/gpuherd/gpuherd/agent/home"

	"github.com/gpuherd/gpuherd/agent/names"
)

// Where a name's authority runs, as seen from outside the agents, so that a
// partition can put a claim's owner on the minority side together with it.

// registryVoters are the name registry's voters among the configured
// members, chosen as every agent chooses them (names.ChooseVoters).
func registryVoters(agents []*agent) []string {
	all := make([]string, len(agents))
	for i, a := range agents {
		all[i] = a.name
	}
	return names.ChooseVoters(all, 3)
}

// registryLeader is the agent whose log says it leads the registry now:
// raft's last state change since its last start is "entering leader
// state". "" when no running agent says so (no registry, or an election).
func registryLeader(agents []*agent) string {
	for _, a := range agents {
		if !a.running() || a.isPaused() {
			continue
		}
		data, err := os.ReadFile(a.logPath)
		if err != nil {
			continue
		}
		if lastRaftState(data) == "leader" {
			return a.name
		}
	}
	return ""
}

// lastRaftState is the state of raft's last "entering … state" line after
// the harness's last start marker in an agent's log.
func lastRaftState(log []byte) string {
	if i := bytes.LastIndex(log, []byte(startMarker)); i >= 0 {
		log = log[i:]
	}
	state := ""
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		for _, s := range []string{"leader", "follower", "candidate"} {
			if strings.Contains(line, "entering "+s+" state") {
				state = s
			}
		}
	}
	return state
}

// oldHome is the claim directory's home of id among nodes (every agent
// alive), as the agents choose it.
func oldHome(id string, nodes []string) string {
	if len(nodes) == 0 {
		return ""
	}
	return home.Of(id, nodes, func(n string) string { return n })
}
