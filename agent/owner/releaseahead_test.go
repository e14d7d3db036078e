package owner

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/internal/datasync"
)

// releaseSeen is a registry that says when a name release reaches it.
type releaseSeen struct {
	Names
	entered chan struct{}
}

func (r *releaseSeen) ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error) {
	close(r.entered)
	return r.Names.ReleaseRemembering(ctx, key, token, node, keep)
}

// A claim's release writes its ledger record and lets its name go while
// the disk syncs that record, as a commit is written while its hold is
// answered: the ledger's fdatasync below waits until the registry has the
// name's release, so a release that synced first, then let the name go,
// fails here. The release is answered once both are done, and a failed
// fdatasync is answered as a write not acknowledged, the name gone and
// the GPUs back on the idle driver all the same.
func TestReleaseSyncedWhileItsNameIsLetGo(t *testing.T) {
	for _, failing := range []bool{false, true} {
		name := "synced"
		if failing {
			name = "fdatasync fails"
		}
		t.Run(name, func(t *testing.T) {
			var armed atomic.Bool
			reg := &releaseSeen{entered: make(chan struct{})}
			o := newTestOwner(t, "l40s-4", nil, ledger.WithDatasync(func(f *os.File) error {
				if !armed.Load() {
					return datasync.File(f)
				}
				select {
				case <-reg.entered:
				case <-time.After(10 * time.Second):
					return errors.New("test: the name's release was not sent while the ledger's release waited for its fdatasync")
				}
				if failing {
					return errors.New("test: input/output error")
				}
				return datasync.File(f)
			}))
			reg.Names = names.NewLocal(o.clk.Now, 30*time.Second)
			o.namesNow = func() Names { return reg }
			ctx := context.Background()
			rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 2}}, Coordinator: "a", Commit: true}
			c, err := o.Reserve(ctx, "vm-1", rr)
			if err != nil || c.State != api.StateClaimed {
				t.Fatalf("claim: %+v, %v", c, err)
			}
			syncs := o.ledger.Fdatasyncs()
			armed.Store(true)
			view, err := o.Abort(ctx, "vm-1")
			switch {
			case failing && (err == nil || !strings.Contains(err.Error(), "not acknowledged")):
				t.Fatalf("release with a failing fdatasync = %+v, %v; want the write not acknowledged", view, err)
			case !failing && err != nil:
				t.Fatalf("release: %v", err)
			case !failing && !view.NameReleased:
				t.Fatalf("release answered %+v; want the name let go", view)
			case !failing && o.ledger.Fdatasyncs()-syncs != 1:
				t.Fatalf("the release cost %d fdatasyncs before its answer; want 1", o.ledger.Fdatasyncs()-syncs)
			}
			if _, err := o.ledger.Get("vm-1"); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("the ledger after the release: %v; want vm-1 gone", err)
			}
			if _, err := reg.Lookup(ctx, names.Claim("vm-1"), names.Linearizable); !errors.Is(err, names.ErrNotFound) {
				t.Errorf("the registry after the release: %v; want the name gone", err)
			}
			if free := o.ledger.Free(o.clk.Now())[l40s]; free != 4 {
				t.Errorf("%d L40S free after the release; want 4", free)
			}
		})
	}
}
