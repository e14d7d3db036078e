// Package names is the cluster's authority over cluster-wide names: claim
// IDs and node-group names. A few agents (three or five voters, chosen from
// the configured membership) run hashicorp/raft over a replicated map of
// name records; every other agent is a client that forwards its requests
// to the leader. A name is granted with a fencing token (the raft index of
// the write that granted it), confirmed by the server that commits the claim
// in its ledger, and released after the ledger has let it go.
//
// The state machine (FSM) is plain Go over plain data and never reads a
// clock: every command that depends on time carries the time the leader
// stamped on it. Registry wraps raft: its data directory (the raft log and
// stable store on bbolt, snapshots as files), bootstrap from the configured
// voters, leader forwarding through a Forwarder, and the typed errors a
// caller acts on. docs/names.md describes the design and its failure
// behaviour.
package names
