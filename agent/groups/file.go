package groups

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/atomicfile"
)

// Without the name registry a group's record is a file on the server that
// created it, which every agent looks for on every server of its view.

// RecordKeeper is a server that keeps group record files: api.Owner's
// part for them, served by a Groups for its own server.
type RecordKeeper interface {
	LookupGroup(ctx context.Context, name string) (api.GroupRecord, error)
	DeleteGroup(ctx context.Context, name string) (api.GroupRecord, error)
}

var _ RecordKeeper = (*Groups)(nil)

func (gs *Groups) groupPath(name string) string {
	return filepath.Join(gs.dir, name+".json")
}

// LookupGroup returns a group record this server keeps in a file.
func (gs *Groups) LookupGroup(_ context.Context, name string) (api.GroupRecord, error) {
	if err := validateGroupName(name); err != nil {
		return api.GroupRecord{}, err
	}
	data, err := os.ReadFile(gs.groupPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return api.GroupRecord{}, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("group %s not found on %s", name, gs.node)}
	}
	if err != nil {
		return api.GroupRecord{}, err
	}
	var rec api.GroupRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return api.GroupRecord{}, fmt.Errorf("group record %s is corrupt: %w", gs.groupPath(name), err)
	}
	return rec, nil
}

// DeleteGroup forgets a group record this server keeps in a file.
func (gs *Groups) DeleteGroup(ctx context.Context, name string) (api.GroupRecord, error) {
	rec, err := gs.LookupGroup(ctx, name)
	if err != nil {
		return rec, err
	}
	return rec, os.Remove(gs.groupPath(name))
}

// findGroup looks for a group's record file on every server of the view.
func (gs *Groups) findGroup(ctx context.Context, name string) (api.GroupRecord, RecordKeeper, error) {
	keepers := gs.view.Keepers()
	var (
		mu    sync.Mutex
		found *api.GroupRecord
		where RecordKeeper
		wg    sync.WaitGroup
	)
	for _, k := range keepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			defer cancel()
			rec, err := k.LookupGroup(lctx, name)
			if err != nil {
				return
			}
			mu.Lock()
			found, where = &rec, k
			mu.Unlock()
		}()
	}
	wg.Wait()
	if found == nil {
		return api.GroupRecord{}, nil, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("group %s not found on any server", name)}
	}
	return *found, where, nil
}

// createGroupFile writes the record file of a new group on this server.
func (gs *Groups) createGroupFile(ctx context.Context, rec api.GroupRecord) (groupEntry, error) {
	if _, _, err := gs.findGroup(ctx, rec.Name); err == nil {
		return groupEntry{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("group %s already exists; delete it first or choose another name", rec.Name)}
	}
	if err := os.MkdirAll(gs.dir, 0o700); err != nil {
		return groupEntry{}, err
	}
	data, _ := json.Marshal(rec)
	if err := atomicfile.Write(gs.groupPath(rec.Name), data, 0o600); err != nil {
		return groupEntry{}, fmt.Errorf("writing group record: %w", err)
	}
	return groupEntry{rec: rec, nodes: legacyNodes(rec), where: gs}, nil
}
