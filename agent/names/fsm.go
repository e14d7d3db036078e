package names

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// FSM applies the registry's commands to its state. raft calls Apply,
// Snapshot and Restore from one goroutine; reads may come from any.
type FSM struct {
	log *slog.Logger

	mu      sync.RWMutex
	st      *state
	applied uint64
	// halted is set by the first command this server cannot apply: its
	// copy would differ from the others' if it went on, so it answers
	// nothing from then on and keeps its log for a newer version to apply.
	halted error
	// durable, when set, waits until this server's copy of a log entry
	// is on disk (Store.WaitDurable): the leader's are written ahead, and
	// nothing is applied, so nothing read or answered, before they are.
	durable func(index uint64) error
}

// notDurable is what Apply answers for a command applied while this
// server's copy of it could not be made durable: the registry answers it
// as unavailable, and uncertain.
type notDurable struct{ err error }

// NewFSM returns an empty registry state machine.
func NewFSM(log *slog.Logger) *FSM {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &FSM{log: log, st: newState()}
}

var _ raft.FSM = (*FSM)(nil)

// Apply runs one committed log entry; raft hands its return value to the
// Apply future on the leader.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	var err error
	if f.durable != nil {
		err = f.durable(l.Index)
	}
	// Applied either way: the entry is committed, and this copy of the
	// state must stay the others'.
	res := f.applyCommand(l.Index, l.Data)
	if err != nil {
		return notDurable{err}
	}
	return res
}

func (f *FSM) applyCommand(idx uint64, data []byte) Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.halted != nil {
		return Result{Code: CodeHalted, Detail: f.halted.Error()}
	}
	t, body, err := decodeMessage(data)
	if err != nil {
		f.halted = fmt.Errorf("raft log entry %d cannot be applied (%w): this agent stopped applying the name registry's log; upgrade it to the version the other registry servers run", idx, err)
		f.log.Error("name registry halted", "index", idx, "err", err)
		return Result{Code: CodeHalted, Detail: f.halted.Error()}
	}
	res := f.st.apply(idx, t, body)
	f.applied = idx
	return res
}

// Lookup returns the record of k as this server's copy has it.
func (f *FSM) Lookup(k Key) (Record, bool, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halted != nil {
		return Record{}, false, f.halted
	}
	r, ok := f.st.get(k)
	return r.clone(), ok, nil
}

// Records returns every live record, sorted by key.
func (f *FSM) Records() ([]Record, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halted != nil {
		return nil, f.halted
	}
	return f.st.list(), nil
}

// Applied is the raft index of the last command applied.
func (f *FSM) Applied() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied
}

func (f *FSM) pendingPast(now time.Time) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.halted == nil && f.st.pendingPast(now)
}

func (s *state) list() []Record {
	keys := make([]Key, 0, len(s.records))
	for k, r := range s.records {
		if r.live(s.now) {
			keys = append(keys, k)
		}
	}
	sortKeys(keys)
	out := make([]Record, len(keys))
	for i, k := range keys {
		out[i] = s.records[k].clone()
	}
	return out
}

// snapshotVersion is the format of a snapshot file. Version 3 added where
// released claim IDs last ran (Recent); a snapshot with none is written as
// version 2, which older servers read. Version 2 added a held name's move
// (Record.Move, MovedFrom); version 1 files, which have none, are read as
// they are.
const snapshotVersion = 3

type snapshotFile struct {
	Version int             `json:"version"`
	Now     time.Time       `json:"now"`
	Applied uint64          `json:"applied"`
	Records []Record        `json:"records"`
	Recent  []rememberedRun `json:"recent,omitempty"`
}

// Snapshot captures the state for raft to persist while Apply goes on.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halted != nil {
		// No snapshot may compact away the entry it could not apply.
		return nil, f.halted
	}
	recs := make([]Record, 0, len(f.st.records))
	for _, r := range f.st.records {
		recs = append(recs, r.clone())
	}
	sortRecords(recs)
	file := snapshotFile{Version: snapshotVersion, Now: f.st.now, Applied: f.applied, Records: recs, Recent: f.st.rememberedRuns()}
	if len(file.Recent) == 0 {
		file.Version = 2
	}
	return &fsmSnapshot{file: file}, nil
}

// Restore replaces the state with a snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	st, applied, err := readSnapshot(rc)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st, f.applied, f.halted = st, applied, nil
	return nil
}

func readSnapshot(r io.Reader) (*state, uint64, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var file snapshotFile
	if err := dec.Decode(&file); err != nil {
		return nil, 0, fmt.Errorf("name registry snapshot: %w", err)
	}
	if file.Version < 1 || file.Version > snapshotVersion {
		return nil, 0, fmt.Errorf("name registry snapshot has format %d; this version reads %d", file.Version, snapshotVersion)
	}
	st := newState()
	st.now = file.Now
	for _, r := range file.Records {
		if err := r.validate(); err != nil {
			return nil, 0, fmt.Errorf("name registry snapshot: %w", err)
		}
		if _, dup := st.records[r.Key()]; dup {
			return nil, 0, fmt.Errorf("name registry snapshot holds %s twice", r.Key())
		}
		st.put(r)
	}
	for _, lr := range file.Recent {
		if err := lr.Key.validate(); err != nil || lr.Key.Kind != KindClaim || lr.Owner == "" {
			return nil, 0, fmt.Errorf("name registry snapshot: remembered run %+v is not a claim ID and a server", lr)
		}
		if _, dup := st.recent[lr.Key]; dup {
			return nil, 0, fmt.Errorf("name registry snapshot remembers %s twice", lr.Key)
		}
		st.recent[lr.Key] = lastRun{Owner: lr.Owner, Until: lr.Until}
	}
	st.rebuildForget()
	return st, file.Applied, nil
}

func sortRecords(recs []Record) {
	keys := make([]Key, len(recs))
	byKey := make(map[Key]Record, len(recs))
	for i, r := range recs {
		keys[i] = r.Key()
		byKey[r.Key()] = r
	}
	sortKeys(keys)
	for i, k := range keys {
		recs[i] = byKey[k]
	}
}

type fsmSnapshot struct{ file snapshotFile }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	err := json.NewEncoder(sink).Encode(s.file)
	if err == nil {
		return sink.Close()
	}
	return errors.Join(fmt.Errorf("write name registry snapshot: %w", err), sink.Cancel())
}

func (s *fsmSnapshot) Release() {}
