package agent

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Storage health: every write the agent makes to its disks reports its
// outcome here, so that a full, read-only or failing disk shows where an
// operator looks (gpuherd_storage_errors_total, gpuherd_storage_failing,
// /readyz, gpuherd status) and not only in the log. A store is failing
// from its first failed write until a later write to it succeeds.

// The stores, the values of the store label.
const (
	storeLedger            = "ledger"             // ledger.db: claims, drains, released claims, GPU facts
	storeRegistryLog       = "registry_log"       // the name registry's raft log and stable store (names.db and its log)
	storeRegistrySnapshots = "registry_snapshots" // the name registry's raft snapshots
	storeMembers           = "members"            // members.json: the servers this agent has seen
)

// stores lists every store, so that each has its gauge series from the
// start.
var stores = []string{storeLedger, storeRegistryLog, storeRegistrySnapshots, storeMembers}

// storeFailure is a store's current failure.
type storeFailure struct {
	op    string
	err   error
	since time.Time
}

// storageHealth tracks each store's last outcome and counts failures.
type storageHealth struct {
	now    func() time.Time
	errors *prometheus.CounterVec
	desc   *prometheus.Desc
	// writes is how long the stores' acknowledged writes took, fsyncs
	// included: a disk that slows every claim shows here first.
	writes *prometheus.HistogramVec

	mu      sync.Mutex
	failing map[string]storeFailure
}

func newStorageHealth(now func() time.Time) *storageHealth {
	return &storageHealth{
		now: now,
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuherd_storage_errors_total",
			Help: "Writes (and reads at start) of the agent's stores that failed, by store (ledger, registry_log, registry_snapshots, members) and operation.",
		}, []string{"store", "op"}),
		desc: prometheus.NewDesc("gpuherd_storage_failing",
			"1 while the store's last write failed (full disk, read-only file system, I/O error), 0 once one succeeds again.",
			[]string{"store"}, nil),
		writes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpuherd_storage_write_duration_seconds",
			Help: "How long the acknowledged durable writes of the agent's stores took, fsyncs included, by store (ledger: one per transaction, which a claim's commit and its release each wait for; registry_log: one per raft log append or term and vote write, on the registry's voters) and operation.",
			// 0.1 ms to 2.4 s: a local SSD's fsync to a failing disk's.
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}, []string{"store", "op"}),
		failing: map[string]storeFailure{},
	}
}

// took records how long one acknowledged write to a store took.
func (h *storageHealth) took(store, op string, d time.Duration) {
	h.writes.WithLabelValues(store, op).Observe(d.Seconds())
}

// result records the outcome of one operation on a store: an error counts
// and marks the store failing, nil clears it. It reports whether the store
// started or stopped failing.
func (h *storageHealth) result(store, op string, err error) (changed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, was := h.failing[store]
	if err == nil {
		delete(h.failing, store)
		return was
	}
	h.errors.WithLabelValues(store, op).Inc()
	if !was {
		f.since = h.now()
	}
	f.op, f.err = op, err
	h.failing[store] = f
	return !was
}

// problems lists the failing stores, sorted by store.
func (h *storageHealth) problems() []api.StorageProblem {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]api.StorageProblem, 0, len(h.failing))
	for store, f := range h.failing {
		out = append(out, api.StorageProblem{Store: store, Op: f.op, Error: f.err.Error(),
			Cause: storageCause(f.err), Since: f.since.UTC(), Action: storageAction(f.err)})
	}
	slices.SortFunc(out, func(x, y api.StorageProblem) int {
		switch {
		case x.Store < y.Store:
			return -1
		case x.Store > y.Store:
			return 1
		}
		return 0
	})
	return out
}

// err is the readiness error while some store fails, nil otherwise.
func (h *storageHealth) err() error {
	ps := h.problems()
	if len(ps) == 0 {
		return nil
	}
	msg := "storage failing:"
	for i, p := range ps {
		if i > 0 {
			msg += ";"
		}
		msg += fmt.Sprintf(" %s %s: %s", p.Store, p.Op, p.Cause)
	}
	return errors.New(msg + " (gpuherd status; docs/operations.md, \"Storage failures\")")
}

func (h *storageHealth) Describe(ch chan<- *prometheus.Desc) {
	h.errors.Describe(ch)
	h.writes.Describe(ch)
	ch <- h.desc
}

func (h *storageHealth) Collect(ch chan<- prometheus.Metric) {
	h.errors.Collect(ch)
	h.writes.Collect(ch)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range stores {
		v := 0.0
		if _, ok := h.failing[s]; ok {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(h.desc, prometheus.GaugeValue, v, s)
	}
}

// storageCause names the class of a storage error in a few words.
func storageCause(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "no space left on device"
	case errors.Is(err, syscall.EROFS):
		return "read-only file system"
	case errors.Is(err, syscall.EIO):
		return "I/O error"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return "permission denied"
	}
	return err.Error()
}

// storageAction says what to do about a storage error.
func storageAction(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "free space on the data directory's file system (df -h; journal, core dumps, old backups); writes resume by themselves"
	case errors.Is(err, syscall.EROFS):
		return "the kernel remounted the file system read-only after an error: check dmesg, drain the server (gpuherd drain --server), then repair and reboot"
	case errors.Is(err, syscall.EIO):
		return "the disk fails: check dmesg and SMART, drain the server (gpuherd drain --server) and replace the disk"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return "the agent runs as root and owns its data directory: check the directory's owner and mode"
	}
	return "see the agent's log (journalctl -u gpuherd) for the failed writes"
}

// storageResult reports one operation's outcome on a store; the log says
// when a store starts failing and when it writes again (each failed write
// is logged where it happens).
func (a *Agent) storageResult(store, op string, err error) {
	if !a.storage.result(store, op, err) {
		return
	}
	if err != nil {
		a.log.Error("storage failing: writes to this store fail until it is repaired", "store", store, "op", op, "cause", storageCause(err), "err", err, "action", storageAction(err))
	} else {
		a.log.Info("storage writes again", "store", store, "op", op)
	}
}
