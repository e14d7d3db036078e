package ledger

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func committed(t *testing.T, l *Ledger, id string, r Request) Claim {
	t.Helper()
	mustReserve(t, l, id, r, t0)
	return mustCommit(t, l, id, t0)
}

func TestMarkUse(t *testing.T) {
	l := newLedger(t)
	c := committed(t, l, "vm-a", req(Item{Model: l40s, Count: 1}))
	a := Use{Domain: "uuid-a", Name: "vm-a", BootID: "boot-1"}

	got, err := l.MarkUse("vm-a", c.GPUs, a, t0.Add(time.Second))
	if err != nil {
		t.Fatalf("MarkUse: %v", err)
	}
	if got.Use.Domain != "uuid-a" || got.Use.Started || !got.Use.Since.Equal(t0.Add(time.Second)) {
		t.Fatalf("use = %+v, want uuid-a, not started, since t0+1s", got.Use)
	}
	// The same domain again (started, reconnect): same since, now started.
	a.Started = true
	got, err = l.MarkUse("vm-a", c.GPUs, a, t0.Add(time.Minute))
	if err != nil || !got.Use.Started || !got.Use.Since.Equal(t0.Add(time.Second)) {
		t.Fatalf("MarkUse again = %+v, %v; want started, since unchanged", got.Use, err)
	}
	// A new start whose previous stop went unreported: not running yet.
	a.Started = false
	if got, _ = l.MarkUse("vm-a", c.GPUs, a, t0.Add(time.Hour)); got.Use.Started {
		t.Fatalf("a new prepare kept the previous run's started: %+v", got.Use)
	}

	// Another domain in the same boot is refused.
	b := Use{Domain: "uuid-b", Name: "vm-b", BootID: "boot-1"}
	_, err = l.MarkUse("vm-a", c.GPUs, b, t0)
	var iu *InUseError
	if !errors.As(err, &iu) || iu.Use.Domain != "uuid-a" {
		t.Fatalf("MarkUse by another domain = %v, want *InUseError naming uuid-a", err)
	}
	// After a reboot the old use is stale.
	b.BootID = "boot-2"
	if got, err = l.MarkUse("vm-a", c.GPUs, b, t0.Add(2*time.Hour)); err != nil || got.Use.Domain != "uuid-b" || got.Use.Started {
		t.Fatalf("MarkUse after a reboot = %+v, %v; want uuid-b, not started", got.Use, err)
	}

	// GPUs that changed since the caller checked them: refused.
	if _, err := l.MarkUse("vm-a", []string{"0000:62:00.0"}, b, t0); !errors.Is(err, ErrConflict) {
		t.Fatalf("MarkUse with other GPUs = %v, want ErrConflict", err)
	}
	// No claim, or only a reservation: not found.
	if _, err := l.MarkUse("vm-z", c.GPUs, b, t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("MarkUse of no claim = %v, want ErrNotFound", err)
	}
	r := mustReserve(t, l, "vm-r", req(Item{Model: h100, Count: 1}), t0)
	if _, err := l.MarkUse("vm-r", r.GPUs, b, t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("MarkUse of a reservation = %v, want ErrNotFound", err)
	}
	if _, err := l.MarkUse("vm-a", c.GPUs, Use{}, t0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("MarkUse without a domain = %v, want ErrInvalid", err)
	}
}

func TestEndUse(t *testing.T) {
	gpu := req(Item{Model: l40s, Count: 1})
	tests := []struct {
		name         string
		mark         *Use // nil: none
		domain       string
		release      bool
		wantErr      error
		wantReleased bool
		wantUse      string // the claim's use after the call, when kept
	}{
		{"started domain, release", &Use{Domain: "a", Started: true}, "a", true, nil, true, ""},
		{"started domain, keep", &Use{Domain: "a", Started: true}, "a", false, nil, false, ""},
		{"never started, release asked", &Use{Domain: "a"}, "a", true, nil, false, ""},
		{"another domain", &Use{Domain: "a", Started: true}, "b", true, ErrNotMarked, false, "a"},
		{"no use", nil, "a", true, ErrNotMarked, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(t)
			c := committed(t, l, "vm-a", gpu)
			if tt.mark != nil {
				if _, err := l.MarkUse("vm-a", c.GPUs, *tt.mark, t0); err != nil {
					t.Fatal(err)
				}
			}
			_, released, err := l.EndUse("vm-a", tt.domain, tt.release, t0)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("EndUse = %v, want %v", err, tt.wantErr)
			}
			if released != tt.wantReleased {
				t.Fatalf("released = %v, want %v", released, tt.wantReleased)
			}
			got, gerr := l.Get("vm-a")
			if tt.wantReleased {
				if !errors.Is(gerr, ErrNotFound) {
					t.Fatalf("after release Get = %+v, %v; want not found", got, gerr)
				}
				return
			}
			if gerr != nil || got.Use.Domain != tt.wantUse {
				t.Fatalf("claim after EndUse: %+v, %v; want kept, in use by %q", got.Use, gerr, tt.wantUse)
			}
		})
	}
	l := newLedger(t)
	if _, _, err := l.EndUse("vm-none", "a", true, t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("EndUse of no claim = %v, want ErrNotFound", err)
	}
}

// A use is durable, and a file written before uses existed opens with none.
func TestUsePersistsAndOldRecordsOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	c := committed(t, l, "vm-a", req(Item{Model: h100, Count: 2}))
	if _, err := l.MarkUse("vm-a", c.GPUs, Use{Domain: "uuid-a", Name: "vm-a", BootID: "b", Started: true}, t0); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A record as an older gpuherd wrote it: no "use" key.
	old := []byte(`{"id":"vm-old","state":"committed","items":[{"model":"L40S","count":1}],"gpus":["0000:61:00.0"],"created_at":"2025-03-01T12:00:00Z","committed_at":"2025-03-01T12:00:00Z","gpu_models":{"0000:61:00.0":"L40S"}}`)
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketClaims).Put([]byte("vm-old"), old) })

	l = openAt(t, path)
	got, err := l.Get("vm-a")
	if err != nil || got.Use.Domain != "uuid-a" || !got.Use.Started || !got.Use.Since.Equal(t0) {
		t.Fatalf("after reopen vm-a = %+v, %v; want in use by uuid-a, started, since t0", got.Use, err)
	}
	o, err := l.Get("vm-old")
	if err != nil || o.Use != (Use{}) {
		t.Fatalf("old record = %+v, %v; want held, in use by none", o, err)
	}
}
