package names

import (
	"io"

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

// observedLog is a log store that reports its writes.
type observedLog struct {
	raft.LogStore
	report func(part, op string, err error)
}

func (o observedLog) StoreLog(l *raft.Log) error {
	err := o.LogStore.StoreLog(l)
	o.report(StorageLog, "append", err)
	return err
}

func (o observedLog) StoreLogs(logs []*raft.Log) error {
	err := o.LogStore.StoreLogs(logs)
	o.report(StorageLog, "append", err)
	return err
}

func (o observedLog) DeleteRange(lo, hi uint64) error {
	err := o.LogStore.DeleteRange(lo, hi)
	o.report(StorageLog, "compact", err)
	return err
}

// observedStable is a stable store that reports its writes.
type observedStable struct {
	raft.StableStore
	report func(part, op string, err error)
}

func (o observedStable) Set(k, v []byte) error {
	err := o.StableStore.Set(k, v)
	o.report(StorageLog, "stable", err)
	return err
}

func (o observedStable) SetUint64(k []byte, v uint64) error {
	err := o.StableStore.SetUint64(k, v)
	o.report(StorageLog, "stable", err)
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
