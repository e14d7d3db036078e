package agent

// LedgerSyncs counts the write transactions this agent's ledger committed
// since it was opened, each fsynced before it returned (ledger.Syncs): the
// disk cost of its claims, for benchmarks (tools/cmd/gpuherd-bench counts
// it per claim, get and release).
func (a *Agent) LedgerSyncs() uint64 { return a.ledger.Syncs() }
