package names

import (
	"io"
	"time"

	"github.com/hashicorp/raft"
)

// The registry's stores as Config.StorageResult sees them: every write to
// the raft log, the stable store and the snapshots reports its outcome, so
// that a voter whose disk is full or failing says so where an operator
// looks. Raft itself only logs such a failure, and the other voters carry
// the quorum meanwhile: nothing else would show it.

// Parts of the registry's storage, as StorageResult names them.
const (
	StorageLog       = "log"       // the raft log and the stable store (term, vote)
	StorageSnapshots = "snapshots" // raft snapshots
)

// observer is told of the stores' writes: each outcome (Config.StorageResult)
// and each successful write's duration (Config.StorageTime); either may be
// nil.
type observer struct {
	report func(part, op string, err error)
	time   func(part, op string, d time.Duration)
}

// done reports a write of part that started at start.
func (o observer) done(part, op string, start time.Time, err error) {
	if err == nil && o.time != nil {
		o.time(part, op, time.Since(start))
	}
	o.reported(part, op, err)
}

// reported is o's report, or one that drops what it is told.
func (o observer) reported(part, op string, err error) {
	if o.report != nil {
		o.report(part, op, err)
	}
}

// observedLog is a log store that reports its writes.
type observedLog struct {
	raft.LogStore
	o observer
}

func (o observedLog) StoreLog(l *raft.Log) error {
	start := time.Now()
	err := o.LogStore.StoreLog(l)
	o.o.done(StorageLog, "append", start, err)
	return err
}

func (o observedLog) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	err := o.LogStore.StoreLogs(logs)
	o.o.done(StorageLog, "append", start, err)
	return err
}

func (o observedLog) DeleteRange(lo, hi uint64) error {
	err := o.LogStore.DeleteRange(lo, hi)
	o.o.reported(StorageLog, "compact", err)
	return err
}

// observedStable is a stable store that reports its writes.
type observedStable struct {
	raft.StableStore
	o observer
}

func (o observedStable) Set(k, v []byte) error {
	start := time.Now()
	err := o.StableStore.Set(k, v)
	o.o.done(StorageLog, "stable", start, err)
	return err
}

func (o observedStable) SetUint64(k []byte, v uint64) error {
	start := time.Now()
	err := o.StableStore.SetUint64(k, v)
	o.o.done(StorageLog, "stable", start, err)
	return err
}

// observedSnapshots is a snapshot store that reports each snapshot's
// creation, writes and close.
type observedSnapshots struct {
	raft.SnapshotStore
	report func(part, op string, err error)
}

func (o observedSnapshots) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration, configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := o.SnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		o.report(StorageSnapshots, "create", err)
		return nil, err
	}
	return &observedSink{SnapshotSink: sink, report: o.report}, nil
}

type observedSink struct {
	raft.SnapshotSink
	report func(part, op string, err error)
	failed bool
}

func (s *observedSink) Write(p []byte) (int, error) {
	n, err := s.SnapshotSink.Write(p)
	if err != nil {
		s.failed = true
		s.report(StorageSnapshots, "write", err)
	}
	return n, err
}

func (s *observedSink) Close() error {
	err := s.SnapshotSink.Close()
	switch {
	case err != nil:
		s.report(StorageSnapshots, "write", err)
	case !s.failed:
		s.report(StorageSnapshots, "write", nil)
	}
	return err
}

var _ io.WriteCloser = (*observedSink)(nil)
