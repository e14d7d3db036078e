package api

import "time"

// Timeouts of the calls between agents. A reservation binds GPUs, which
// takes seconds; the other owner operations only touch the owner's ledger;
// a registry call may wait for an election.
const (
	ReserveTimeout = 20 * time.Second
	OwnerOpTimeout = 5 * time.Second
	LookupTimeout  = 2 * time.Second
	AbortTimeout   = 2 * time.Second
	NameTimeout    = 8 * time.Second
)
