// Command gpuherd-chaos runs gpuherd agents as separate processes, each in
// its own network namespace joined by a veth pair to a bridge in a "hub"
// namespace (10.77.0.0/24), drives concurrent clients through them, and
// injects faults from a fixed seed: kill -9 and restart on the same data
// dir and ports, SIGSTOP shorter and longer than the reservation lease,
// a node's hub link down, split partitions and packet loss (nftables in the
// hub's bridge), and faults aimed at a claim's owner while clients retry
// the claim through the other agents.
//
// The clients retry like the platform's: an answer that leaves the outcome
// open (503, a timeout, a dead agent) is retried with the same ID and
// request through other agents, with backoff, for a bounded time; they
// re-send held claims, send another request under a held ID (which must be
// a conflict), retry releases, read IDs that never existed and create,
// resize and delete node groups.
//
// Answers are checked as they arrive (no second copy, no "not available"
// for a held claim, no "not found" for a held one, nothing found after an
// acknowledged release). Afterwards it heals everything, kill -9s and
// restarts every agent, waits out every lease and checks the invariants of
// docs/protocol.md against the final state and the run's history: no GPU
// in two live claims, no claim ID on two servers, no acknowledged commit
// lost, nothing held after an acknowledged release, no reservation
// outliving its lease, every claimed GPU on vfio-pci, groups all or
// nothing, no GPU fenced by a cancelled context. Then IDs that never
// existed must answer "not found", also once one member is killed and kept
// dead. It needs root and nft; .ci/faults.sh runs it.
package main
