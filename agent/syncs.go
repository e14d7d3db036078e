package agent

// LedgerSyncs counts the durable writes this agent's ledger acknowledged
// since it was opened (ledger.Syncs: journal records, one fdatasync each):
// the disk cost of its claims, for benchmarks (tools/cmd/gpuherd-bench
// counts it per claim, get and release).
func (a *Agent) LedgerSyncs() uint64 { return a.ledger.Syncs() }

// LedgerFdatasyncs counts every fdatasync this agent's ledger asked of the
// disk since it was opened (ledger.Fdatasyncs): its writes' and its
// checkpoints'.
func (a *Agent) LedgerFdatasyncs() uint64 { return a.ledger.Fdatasyncs() }

// RegistrySyncs counts the fdatasyncs and fsynced transactions of this
// agent's copy of the name registry's raft store since it opened (its log
// appends, term and vote), 0 on an agent that holds no copy: the
// registry's disk cost, for benchmarks.
func (a *Agent) RegistrySyncs() uint64 {
	c := a.cluster
	if c == nil {
		return 0
	}
	rs := c.names.Load()
	if rs == nil {
		return 0
	}
	reg := rs.Names()
	if reg == nil || reg.Store() == nil {
		return 0
	}
	return reg.Store().Commits()
}
