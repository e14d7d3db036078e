package claim

import (
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// Target is a server a coordinator may ask: this agent or a peer.
type Target struct {
	name   string
	self   bool
	owner  api.Owner
	server placement.Server
	caps   map[string]ledger.ModelTotals
}

func targetNamed(targets []Target, name string) (Target, bool) {
	for _, t := range targets {
		if t.name == name {
			return t, true
		}
	}
	return Target{}, false
}

// targetName is t's node name, by which home.Of chooses an ID's home.
func targetName(t Target) string { return t.name }

// NewTarget is a server a coordinator may ask: its name, whether it is this
// server, its owner API, and its capacity as the coordinator knows it.
func NewTarget(name string, self bool, o api.Owner, free map[string]int, drained bool, caps map[string]ledger.ModelTotals) Target {
	return Target{name: name, self: self, owner: o, server: placement.Server{Name: name, Free: free, Drained: drained}, caps: caps}
}

// Name is the server's node name.
func (t Target) Name() string { return t.name }

// Self reports whether the target is this server.
func (t Target) Self() bool { return t.self }

// Owner is the server's owner API.
func (t Target) Owner() api.Owner { return t.owner }

// Named is the target named name among targets.
func Named(targets []Target, name string) (Target, bool) { return targetNamed(targets, name) }

// Caps are the server's totals by model, as the coordinator knows them.
func (t Target) Caps() map[string]ledger.ModelTotals { return t.caps }

// Drained reports whether the server takes no new claims.
func (t Target) Drained() bool { return t.server.Drained }
