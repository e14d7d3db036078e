// Package metrics is gpuherd's Prometheus exporter.
//
// Gauges that describe state (GPUs, capacity, gossip, ledger) are built at
// each scrape from one Snapshot of a Source, as const metrics: a GPU that
// leaves the server simply stops appearing, with no stale series to delete.
// Events (claims, reservations, vfio operations, XID errors) are counted as
// they happen through the Recorder interface, which *Metrics implements.
// Serve exposes the registry on plain HTTP with /healthz and /readyz.
//
// Conventions, from the Prometheus naming and exporter guides: base units
// (seconds, bytes, celsius, joules, ratio), counters end in _total,
// metadata series end in _info and have the value 1. A GPU is labelled by
// pci_address ("0000:3b:00.0", its identity) and model ("NVIDIA H100
// 80GB"); there is no hostname label, which is the scrape target's job.
// There are no sentinel values: a reading NVML does not give, or a cluster
// that does not exist, produces no sample rather than 0 or -1.
//
// # Build
//
//	gpuherd_build_info{version,revision,goversion}  gauge  always 1
//	gpuherd_agent_phase{phase}
//	    gauge, one series per phase (checking, discovering, reconciling,
//	    joining, serving, stopping), 1 for the current one. Registered by
//	    the agent (agent/listeners.go): the listener answers from before
//	    discovery, so a long bind at start shows here.
//
// # GPUs of this server
//
//	gpuherd_gpu_info{pci_address,model,device_id,iommu_group,numa_node,uuid}
//	    gauge, always 1. device_id is the PCI device ID in four lower-case
//	    hex digits ("2330"). iommu_group and numa_node are empty when
//	    unknown, uuid is empty while NVML has never seen the card; the label
//	    set itself never changes.
//	gpuherd_gpu_state{pci_address,model,state}
//	    gauge, one series per state: free, reserved, claimed, unhealthy,
//	    unusable, drained; 1 for the GPU's current state, 0 for the others.
//	    A state outside that list appears as an extra series with 1.
//	    unusable: healthy, but its IOMMU group cannot be passed through now
//	    (a device the host uses shares it, the IOMMU is off, ...).
//	gpuherd_gpu_unusable_info{pci_address,model,reason,blocking_device}
//	    gauge, always 1, only while the GPU cannot be passed through: reason
//	    is the first blocking problem's code (group_not_viable, no_iommu,
//	    group_unreadable, vfio_pci_missing, no_interrupt_remapping,
//	    not_allowed), blocking_device the PCI address of the device that
//	    blocks it, empty when none does. `gpuherd status` says what to do.
//	gpuherd_gpu_driver_info{pci_address,model,driver}
//	    gauge, always 1: the kernel driver bound to the GPU (nvidia,
//	    vfio-pci, ...), "none" when unbound.
//	gpuherd_gpu_healthy{pci_address,model}
//	    gauge, 1 healthy, 0 not (fell off the bus, stuck unbind, ...).
//
// # NVML telemetry
//
// Only for GPUs the host driver holds (NVML cannot see a card on vfio-pci),
// and each only when NVML gives that reading. Labels {pci_address,model}.
//
//	gpuherd_gpu_temperature_celsius   gauge    GPU core temperature
//	gpuherd_gpu_power_watts           gauge    board power draw
//	gpuherd_gpu_energy_joules_total   counter  energy since the nvidia driver was loaded
//	gpuherd_gpu_memory_used_bytes     gauge    framebuffer in use
//	gpuherd_gpu_memory_total_bytes    gauge    framebuffer size
//	gpuherd_gpu_utilization_ratio     gauge    share of the last sample period a kernel ran, 0..1
//
//	gpuherd_gpu_xid_errors_total{pci_address,model,xid}
//	    counter: critical XID errors NVML reported, by XID number (decimal).
//	    A series appears with its first error.
//
// # Capacity
//
// This server, one series per model it has:
//
//	gpuherd_model_gpus{model}          gauge  GPUs of the model
//	gpuherd_model_gpus_free{model}     gauge  GPUs a new claim can take
//	gpuherd_model_gpus_healthy{model}   gauge  healthy GPUs that can be passed through
//	gpuherd_model_gpus_unusable{model}  gauge  healthy GPUs that cannot be passed through now
//
// The cluster, as this agent's gossip view has it; absent while the agent
// runs without a cluster:
//
//	gpuherd_cluster_model_gpus{model}                 gauge  GPUs of the model
//	gpuherd_cluster_model_gpus_free{model}            gauge  free GPUs
//	gpuherd_cluster_model_gpus_healthy{model}         gauge  healthy GPUs
//	gpuherd_cluster_model_gpus_unusable{model}        gauge  GPUs that cannot be passed through now
//	gpuherd_cluster_model_max_free_per_server{model}  gauge  most free GPUs on any one
//	                                                         server: the largest
//	                                                         request that can be placed
//
// # Claims and reservations
//
//	gpuherd_claims_total{outcome}
//	    counter: claim requests answered by this agent. outcome: granted,
//	    not_available, invalid, conflict, bind_failed, error (all present
//	    from the start at 0).
//	gpuherd_claim_duration_seconds
//	    histogram: time from a claim request to its answer, any outcome;
//	    buckets from 1 ms to 60 s.
//	gpuherd_claim_lookups_total{path}
//	    counter: claim-ID lookups of the claims, gets and releases this agent
//	    coordinated. path: local (this server holds the claim), directory
//	    (the ID's home answered), every_server (the home could not vouch;
//	    every server was asked), registry (the name registry answered, or,
//	    for a claim placed at once, the owner's hold decided).
//	    All present from the start at 0.
//	gpuherd_reservations_total{outcome}
//	    counter: reservation events. outcome: reserved, failed (no GPUs, or
//	    they would not bind), committed, expired, released, aborted,
//	    abandoned (not taken: the coordinator stopped waiting first, a
//	    timeout or a restart on its side) (all present from the start at 0).
//	gpuherd_ledger_claims{state}
//	    gauge: claims in the local ledger; state: reserved, committed.
//	gpuherd_ledger_file_size_bytes
//	    gauge: size of the ledger file.
//
// # Storage
//
// Registered by the agent (agent/storage.go). store: ledger (ledger.db),
// registry_log (the name registry's raft log and stable store),
// registry_snapshots (its raft snapshots), members (members.json, the
// servers this agent has seen).
//
//	gpuherd_storage_errors_total{store,op}
//	    counter: writes to a store that failed (a full disk, a read-only
//	    file system, an I/O error); op: write, remember_released, facts,
//	    checkpoint (ledger: its journal moved into ledger.db), append,
//	    compact, stable (registry_log), create, write (registry_snapshots),
//	    write, read (members). A series appears with its first error.
//	gpuherd_storage_failing{store}
//	    gauge: 1 from a store's first failed write until a write to it
//	    succeeds again, 0 otherwise (the ledger: until a checkpoint
//	    succeeds, once one failed); one series per store from the start.
//	    /readyz answers 503 and `gpuherd status` names the store, the cause
//	    and what to do meanwhile.
//	gpuherd_storage_write_duration_seconds{store,op}
//	    histogram: how long a store's acknowledged durable writes took,
//	    fsyncs included (0.1 ms to 2.4 s). ledger: one per journal record
//	    (op write: a claim's commit, its release, a drain;
//	    remember_released; facts), one fdatasync each, and one per
//	    checkpoint (op checkpoint: the journal moved into ledger.db, a bbolt
//	    transaction, two fdatasyncs); a claim waits for its commit. registry_log, on the
//	    registry's voters: op append (raft log appends, one fdatasync each;
//	    a claim waits for its hold's on the leader and on a follower) and
//	    stable (term and vote). A series appears with its first write.
//
// # vfio
//
//	gpuherd_vfio_operation_duration_seconds{op}
//	    histogram: time to move a GPU's IOMMU group to vfio-pci (op="bind")
//	    or back to the idle driver (op="release"), failures included;
//	    buckets from 1 ms to 30 s.
//	gpuherd_vfio_operation_errors_total{op}
//	    counter: binds and releases that failed. op: bind, release (both
//	    present from the start at 0).
//
// # VMs using GPUs
//
//	gpuherd_driver_changes_unexpected_total{pci_address,driver}
//	    counter: GPUs the driver check found on a driver the ledger does not
//	    expect (driver: the one found, "none" for no driver), e.g. rebound
//	    to nvidia by libvirt's managed='yes' at VM stop; each was put back
//	    (or fenced when it could not be).
//	gpuherd_claims_adopted_total
//	    counter: claims the agent created at start for GPUs a running VM
//	    held open while no claim did (adopted-<node>-<domain or pid>).
//	gpuherd_releases_refused_in_use_total
//	    counter: releases refused because a VM held the claim's GPUs open.
//
// # Names and ledger (the owner's anti-entropy pass)
//
// Present from the start at 0; they move only while the agent runs the
// name registry (docs/protocol.md, "Anti-entropy").
//
//	gpuherd_claim_duplicates
//	    gauge: copies of a claim ID this server holds while the name
//	    registry names a copy on another server; each is kept only while a
//	    VM uses it, and released by the next pass after the VM stops.
//	gpuherd_claim_duplicates_released_total
//	    counter: duplicate copies this server released (no VM used them).
//	gpuherd_claim_names_adopted_total
//	    counter: committed claims with no name (an older version's ledger)
//	    that were given their name, held on this server.
//	gpuherd_claim_names_freed_total
//	    counter: names the registry held on this server with no claim in
//	    its ledger (a release that could not reach the registry), released.
//	gpuherd_anti_entropy_skipped_total
//	    counter: passes skipped because the name registry did not answer.
//	gpuherd_claim_awaiting_name_settled_total
//	    counter: claims committed ahead of their name by a commit a crash
//	    cut short, kept because the registry holds their ID here.
//	gpuherd_claim_awaiting_name_undone_total
//	    counter: such claims removed, their GPUs freed, because the
//	    registry does not hold their ID here (no client was told of them).
//
// # Gossip
//
// Absent while the agent runs without a cluster.
//
//	gpuherd_gossip_members{state}
//	    gauge: members by memberlist state, as this agent sees them: alive,
//	    suspect, dead, left (each present, 0 when none). A dead member
//	    stays counted after the member list forgets it, until it comes back.
//	gpuherd_gossip_health_score
//	    gauge: memberlist's awareness score of this agent; 0 is healthy,
//	    higher means it answers probes late (overloaded or a slow network).
//
// # Runtime
//
// The Go runtime (go_*), process (process_*) and promhttp handler
// (promhttp_metric_handler_*) collectors of client_golang are there too.
package metrics
