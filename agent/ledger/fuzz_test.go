package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecodeClaim feeds arbitrary records to the decoder Open runs over
// every claim of the file. It must never panic, and what it accepts must
// hold what the rest of the ledger relies on.
func FuzzDecodeClaim(f *testing.F) {
	f.Add([]byte("vm-1"), []byte(`{"id":"vm-1","state":"committed","items":[{"model":"H100 80GB","count":1}],"gpus":["0000:18:00.0"],"created_at":"2025-03-01T12:00:00Z","committed_at":"2025-03-01T12:00:00Z"}`))
	f.Add([]byte("vm-2"), []byte(`{"id":"vm-2","state":"reserved","gpus":["0000:18:00.0"],"expires_at":"2025-03-01T12:01:00Z","gpu_models":{"0000:18:00.0":"L40S"}}`))
	f.Add([]byte("vm-3"), []byte(`{"id":"vm-3","state":"reserved","gpus":["x"]}`))
	f.Add([]byte("vm-4"), []byte(`{"id":"vm-4","state":"limbo","gpus":["x"]}`))
	f.Add([]byte("vm-5"), []byte(`{"id":"vm-5","state":"committed","gpus":[]}`))
	f.Add([]byte(""), []byte(`{`))
	f.Add([]byte("\x00"), []byte(`{"id":"\u0000","state":"committed","gpus":["a"],"created_at":"9999-99-99T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		rec, err := decodeClaim(key, value)
		if err != nil {
			_ = (&CorruptError{Path: "ledger.db", Bucket: "claims", Key: string(key), Err: err}).Error()
			return
		}
		switch {
		case rec.ID != string(key):
			t.Fatalf("accepted claim %q under key %q", rec.ID, key)
		case len(rec.GPUs) == 0:
			t.Fatal("accepted a claim without GPUs")
		case rec.State != StateReserved && rec.State != StateCommitted:
			t.Fatalf("accepted state %q", rec.State)
		case rec.State == StateReserved && rec.ExpiresAt.IsZero():
			t.Fatal("accepted a reservation without a deadline")
		}
	})
}

// FuzzJournal feeds arbitrary bytes to the journal's reader, which Open
// runs before anything else: it must never panic, and what it returns
// must be numbered on from the file's sequence, one by one, and hold only
// operations the ledger writes; a whole, valid record behind the fuzzed
// bytes changes none of that.
func FuzzJournal(f *testing.F) {
	valid := func(seq uint64, ops ...journalOp) []byte {
		b, err := encodeJournalRecord(journalRecord{Seq: seq, Ops: ops})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	rev := journalOp{Bucket: "meta", Key: "revision", Value: encodeRevision(3)}
	claim := journalOp{Bucket: "claims", Key: "vm-1", Value: []byte(`{"id":"vm-1"}`)}
	f.Add(valid(1, claim, rev), uint64(0))
	f.Add(append(valid(1, claim, rev), valid(2, journalOp{Bucket: "claims", Key: "vm-1", Delete: true})...), uint64(0))
	f.Add(append(valid(5, rev), valid(6, rev)...), uint64(5))
	f.Add(valid(1, journalOp{Bucket: "meta", Key: "schema", Value: []byte("9")}), uint64(0))
	f.Add(valid(1, journalOp{Bucket: "elsewhere", Key: "k", Value: []byte("v")}), uint64(0))
	f.Add([]byte("\x05\x00\x00\x00\x00\x00\x00\x00{}"), uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, base uint64) {
		path := filepath.Join(t.TempDir(), "j")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		recs, end, err := readJournal(path, base)
		if err != nil {
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("a damaged journal: %v, want a CorruptError", err)
			}
			return
		}
		if end < 0 || end > int64(len(data)) {
			t.Fatalf("end %d outside the journal's %d bytes", end, len(data))
		}
		for i, r := range recs {
			if r.Seq != base+1+uint64(i) {
				t.Fatalf("record %d is number %d, base %d", i, r.Seq, base)
			}
			if err := checkOps(r.Ops); err != nil {
				t.Fatalf("returned record %d: %v", r.Seq, err)
			}
		}
	})
}
