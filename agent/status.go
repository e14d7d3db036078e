package agent

import (
	"context"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/status"
)

// newStatus builds the status of a's GPUs (agent/status) over its ledger
// and host; the registry and the stores are read when asked.
func newStatus(a *Agent) *status.Reader {
	return status.New(status.Deps{
		Node:       a.cfg.NodeName,
		Version:    Version,
		Ledger:     a.ledger,
		Host:       a.host,
		Clock:      a.clk,
		Generation: a.feed.current,
		Names:      func() *api.NamesStatus { return a.registry.Status() },
		Storage:    a.storage.problems,
	})
}

// Status lists this server's GPUs with their state (agent/status).
func (a *Agent) Status(ctx context.Context) (api.Status, error) { return a.status.Status(ctx) }

// Version is this build.
func (a *Agent) Version() api.VersionInfo { return VersionInfo() }
