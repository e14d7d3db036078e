package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/gpuherd/gpuherd/agent/internal/testmain"
)

// TestMain keeps the tests' files in memory (testmain.Run): their fsyncs
// are real, the disk under them is not what they test. Every batch of
// every test checks that the state it starts from, a copy of the
// published one, is what reading the file again gives (runBatch).
func TestMain(m *testing.M) {
	testBatchBase = func(tx *fileTx, path string, st *state) {
		if err := sameAsFile(tx, path, st); err != nil {
			panic("a batch starts from a state the file does not hold: " + err.Error())
		}
	}
	os.Exit(testmain.Run(m, 0))
}

// sameAsFile compares st, without its reservations and inventory, with
// the state in tx's file, record by encoded record.
func sameAsFile(tx *fileTx, path string, st *state) error {
	file, err := load(tx, path)
	if err != nil {
		return err
	}
	if file.rev > st.rev {
		return fmt.Errorf("revision %d, the file's is %d", st.rev, file.rev)
	}
	committed := map[string]claimRecord{}
	for id, rec := range st.claims {
		if rec.State != StateReserved {
			committed[id] = rec
		}
	}
	ids := slices.Sorted(maps.Keys(committed))
	fileIDs := slices.Sorted(maps.Keys(file.claims))
	if !slices.Equal(ids, fileIDs) {
		return fmt.Errorf("claims %q, the file's %q", ids, fileIDs)
	}
	for _, id := range ids {
		if err := sameJSON("claim "+id, committed[id], file.claims[id]); err != nil {
			return err
		}
	}
	return sameJSON("drains", st.drains, file.drains)
}

func sameJSON(what string, a, b any) error {
	ja, err := json.Marshal(a)
	if err != nil {
		return err
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if !bytes.Equal(ja, jb) {
		return fmt.Errorf("%s: %s, the file's %s", what, ja, jb)
	}
	return nil
}
