package ledger

import (
	"errors"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// putClaimRecord writes rec into the file behind the ledger's back.
func putClaimRecord(t *testing.T, path string, rec claimRecord) {
	t.Helper()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketClaims).Put([]byte(rec.ID), mustJSON(t, rec))
	})
}

func committedRecord(id string, items []Item, models map[string]string, gpus ...string) claimRecord {
	return claimRecord{Claim: Claim{ID: id, State: StateCommitted, Items: items, GPUs: gpus, CreatedAt: t0, CommittedAt: t0}, GPUModels: models}
}

// Records that each read fine but contradict each other (issue 11,
// "Ledger integrity") stop Open, with every problem named, the file
// unchanged; Inspect lists the same problems.
func TestOpenRefusesContradictoryClaims(t *testing.T) {
	// ledgerFile holds vm-1 with one H100; which one the ledger picked:
	first := func(t *testing.T, path string) string {
		rep, err := Inspect(path, 0)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Claims[0].GPUs[0]
	}
	tests := []struct {
		name  string
		write func(t *testing.T, path, held string) claimRecord
		want  []string // in the error, besides the path
	}{
		{"a GPU in two claims", func(t *testing.T, path, held string) claimRecord {
			return committedRecord("vm-2", []Item{{Model: h100, Count: 1}}, map[string]string{held: h100}, held)
		}, []string{"claim vm-2", "which claim vm-1 holds too", "one GPU is in two claims"}},
		{"a GPU the ledger does not hold", func(t *testing.T, path, held string) claimRecord {
			return committedRecord("vm-2", []Item{{Model: h100, Count: 1}}, map[string]string{}, "0000:9a:00.0")
		}, []string{"claim vm-2", "0000:9a:00.0", "which the ledger does not hold"}},
		{"items that do not match the models", func(t *testing.T, path, held string) claimRecord {
			return committedRecord("vm-2", []Item{{Model: h100, Count: 2}}, map[string]string{"0000:9a:00.0": h100, "0000:61:00.0": l40s}, "0000:61:00.0", "0000:9a:00.0")
		}, []string{"claim vm-2", "asks for 2x H100 80GB but holds 1x H100 80GB, 1x L40S"}},
		{"a GPU that is no PCI address", func(t *testing.T, path, held string) claimRecord {
			return committedRecord("vm-2", []Item{{Model: h100, Count: 1}}, map[string]string{"GPU0": h100}, "GPU0")
		}, []string{"claim vm-2", `"GPU0" is not a PCI address`}},
		{"a GPU named twice", func(t *testing.T, path, held string) claimRecord {
			return committedRecord("vm-2", []Item{{Model: h100, Count: 2}}, map[string]string{"0000:9a:00.0": h100}, "0000:9a:00.0", "0000:9a:00.0")
		}, []string{"claim vm-2", "names GPU 0000:9a:00.0 twice"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := ledgerFile(t)
			putClaimRecord(t, path, tt.write(t, path, first(t, path)))
			err := openMustFail(t, path)
			var ie *IntegrityError
			if !errors.As(err, &ie) || !errors.Is(err, ErrIntegrity) || errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open = %v, want *IntegrityError (and no unreadable record)", err)
			}
			for _, s := range append(tt.want, path, "not changed", "no driver was moved", "gpuherd ledger remove-claim") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q lacks %q", err, s)
				}
			}
			rep, err := Inspect(path, 0)
			if !errors.Is(err, ErrIntegrity) || len(rep.Problems) != len(ie.Problems) || len(rep.Problems) == 0 {
				t.Fatalf("Inspect = %+v, %v; want the problems Open found: %+v", rep, err, ie.Problems)
			}
			if p := rep.Problems[0]; p.Bucket != "claims" || p.Key != "vm-2" {
				t.Errorf("problem %+v, want it on claims/vm-2", p)
			}
		})
	}
}

// Open stops at no single problem: every unreadable record and every
// contradiction is named at once, and the unreadable ones are still
// *CorruptErrors to errors.As.
func TestOpenNamesEveryProblem(t *testing.T) {
	path := ledgerFile(t)
	rep, err := Inspect(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	held := rep.Claims[0].GPUs[0]
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketClaims)
		if err := b.Put([]byte("vm-a"), []byte("{garbage")); err != nil {
			return err
		}
		if err := b.Put([]byte("vm-b"), mustJSON(t, committedRecord("vm-b", []Item{{Model: h100, Count: 1}}, map[string]string{held: h100}, held))); err != nil {
			return err
		}
		return tx.Bucket(bucketDrains).Put([]byte("0000:9a:00.0"), []byte("[]"))
	})
	err = openMustFail(t, path)
	var ie *IntegrityError
	if !errors.As(err, &ie) {
		t.Fatalf("Open = %v, want *IntegrityError", err)
	}
	var keys []string
	for _, p := range ie.Problems {
		keys = append(keys, p.Bucket+"/"+p.Key)
	}
	if got, want := strings.Join(keys, " "), "claims/vm-a drains/0000:9a:00.0 claims/vm-b"; got != want {
		t.Errorf("problems on %s, want %s: %v", got, want, err)
	}
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Key != "vm-a" || !errors.Is(err, ErrCorrupt) {
		t.Errorf("errors.As CorruptError = %+v, want the unreadable vm-a", ce)
	}
}

// RemoveClaim is the way out: it deletes the wrong record, readable or
// not, and the file opens again with the other claim intact.
func TestRemoveClaimRepairsARefusedLedger(t *testing.T) {
	path := ledgerFile(t)
	rep, err := Inspect(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	held := rep.Claims[0].GPUs[0]
	putClaimRecord(t, path, committedRecord("vm-2", []Item{{Model: h100, Count: 1}}, map[string]string{held: h100}, held))
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketClaims).Put([]byte("vm-3"), []byte("{")) })
	if _, err := Open(path); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("Open of the damaged file = %v", err)
	}

	l := openAt(t, ledgerFile(t)) // another agent's file, held: refused
	if _, err := RemoveClaim(l.Path(), "vm-1", 50e6); !errors.Is(err, ErrLocked) {
		t.Errorf("RemoveClaim on a held file = %v, want ErrLocked", err)
	}
	if _, err := RemoveClaim(path, "vm-9", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveClaim of an unknown claim = %v, want ErrNotFound", err)
	}
	c, err := RemoveClaim(path, "vm-2", 0)
	if err != nil || c.ID != "vm-2" || len(c.GPUs) != 1 || c.GPUs[0] != held {
		t.Fatalf("RemoveClaim(vm-2) = %+v, %v", c, err)
	}
	if c, err := RemoveClaim(path, "vm-3", 0); err != nil || c.ID != "vm-3" {
		t.Fatalf("RemoveClaim of an unreadable record = %+v, %v", c, err)
	}
	after, err := Inspect(path, 0)
	if err != nil || len(after.Claims) != 1 || after.Claims[0].ID != "vm-1" || after.Revision != rep.Revision+2 {
		t.Fatalf("Inspect after the repair = %+v, %v; want vm-1 alone, revision %d", after, err, rep.Revision+2)
	}
	openAt(t, path)
}
