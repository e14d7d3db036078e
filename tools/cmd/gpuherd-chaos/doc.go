// Command gpuherd-chaos runs gpuherd agents as separate processes, each in
// its own network namespace joined by a veth pair to a bridge in a "hub"
// namespace (10.77.0.0/24), drives concurrent claimers through them, and
// injects faults from a fixed seed: kill -9 and restart on the same data
// dir and ports, SIGSTOP shorter and longer than the reservation lease,
// a node's hub link down, split partitions and packet loss (nftables in the
// hub's bridge). Afterwards it heals everything, kill -9s and restarts every
// agent, waits out every lease and checks the invariants of docs/protocol.md
// against the final state and the run's history: no GPU in two live claims,
// no acknowledged commit lost, no reservation outliving its lease, every
// claimed GPU on vfio-pci. It needs root and nft; .ci/faults.sh runs it.
package main
