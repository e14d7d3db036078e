package ledger

import (
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
