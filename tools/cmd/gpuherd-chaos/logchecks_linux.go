package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Checks on what the agents logged (issue 11, point 3: a release that the
// client gave up on ran its return to the idle driver under the request's
// cancelled context and fenced healthy GPUs).

// fenceMsg is the start of the agent's log message when it fences a GPU
// (agent.go, fence).
const fenceMsg = "GPU fenced off"

// fenceEvent is one "GPU fenced off" line of an agent's log.
type fenceEvent struct {
	addr string // its pci_address attribute
	line string
}

// fenceEvents are the fence lines of log, oldest first.
func fenceEvents(log []byte) []fenceEvent {
	var out []fenceEvent
	for _, line := range strings.Split(string(log), "\n") {
		if !strings.Contains(line, fenceMsg) {
			continue
		}
		ev := fenceEvent{line: line}
		if _, rest, ok := strings.Cut(line, "pci_address="); ok {
			ev.addr, _, _ = strings.Cut(strings.Trim(rest, `"`), " ")
			ev.addr = strings.Trim(ev.addr, `"`)
		}
		out = append(out, ev)
	}
	return out
}

// sinceLastStart is the part of an agent's log its current process wrote.
func sinceLastStart(log []byte) []byte {
	if i := bytes.LastIndex(log, []byte(startMarker)); i >= 0 {
		return log[i:]
	}
	return log
}

// checkFenceCancelled reports every GPU that node fenced because a driver
// move ran under a cancelled context: a client's timeout, not the GPU.
func checkFenceCancelled(h *history, node string, log []byte) {
	for _, ev := range fenceEvents(log) {
		if strings.Contains(ev.line, "context canceled") {
			h.violate("fenced-by-cancelled-context", "%s fenced %s because a driver move was cancelled with its request: %s", node, ev.addr, ev.line)
		}
	}
}

// checkFencedNotFree reports every GPU that node's running process fenced
// (logSinceStart) and that its status offers as free: a fenced GPU must
// never be handed to the next claim.
func checkFencedNotFree(h *history, node string, logSinceStart []byte, st api.Status) {
	state := map[string]string{}
	for _, g := range st.GPUs {
		state[g.PCIAddress] = g.State
	}
	seen := map[string]bool{}
	for _, ev := range fenceEvents(logSinceStart) {
		if seen[ev.addr] {
			continue
		}
		seen[ev.addr] = true
		if state[ev.addr] == api.StateFree {
			h.violate("fenced-gpu-offered", "%s status shows %s free after its process logged: %s", node, ev.addr, ev.line)
		}
	}
}

// readLog reads an agent's log; a missing log is a harness error.
func readLog(a *agent) ([]byte, error) {
	data, err := os.ReadFile(a.logPath)
	if err != nil {
		return nil, fmt.Errorf("reading %s's log: %w", a.name, err)
	}
	return data, nil
}

// resizeLeftMixedMsg is the agent's log message when a failed group resize
// could not put every node back (agent/groups, restoreGroup).
const resizeLeftMixedMsg = `msg="group resize failed and left nodes changed"`

// loggedResizeLeftMixed reports whether any of agents logged that a resize
// of group failed and left nodes changed.
func loggedResizeLeftMixed(agents []*agent, group string) bool {
	for _, a := range agents {
		data, err := os.ReadFile(a.logPath)
		if err != nil {
			continue
		}
		if resizeLeftMixedIn(data, group) {
			return true
		}
	}
	return false
}

// resizeLeftMixedIn reports whether log has the line for group.
func resizeLeftMixedIn(log []byte, group string) bool {
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, resizeLeftMixedMsg) && strings.Contains(line+" ", " group="+group+" ") {
			return true
		}
	}
	return false
}
