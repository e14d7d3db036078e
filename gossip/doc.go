// Package gossip publishes this server's GPU capacity to the other servers of
// the platform and keeps this server's view of theirs, over hashicorp/memberlist.
//
// What travels here is a hint for choosing where to ask for GPUs, never the
// truth: the owner's ledger decides every claim. The package therefore favours
// staying small and fast (a compact summary in memberlist's 512-byte NodeMeta,
// re-advertised with coalescing) over completeness.
//
// Files: summary.go (the capacity codec), keyring.go (the gossip key file and
// rotation), advertise.go (the advertise address from the routing table),
// cluster.go (lifecycle), join.go (seed joining with retry), publish.go
// (coalesced re-advertising), view.go (the member list and change
// notifications), delegate.go (memberlist callbacks), logging.go (memberlist's
// log lines into slog).
package gossip
