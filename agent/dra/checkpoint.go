package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/gpuherd/gpuherd/internal/atomicfile"
	"k8s.io/apimachinery/pkg/types"
)

// prepared is what the driver remembers of one prepared ResourceClaim:
// the kubelet's unprepare names only its UID, namespace and name, and a
// claim-first VM's use must be ended with the pod it was marked for. It is
// written before the ledger changes (write-ahead), so that a crash in
// between still leaves the unprepare all it needs.
type prepared struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Claim is the gpuherd claim: made for this ResourceClaim, or the one
	// it is pinned to (First).
	Claim string `json:"claim"`
	First bool   `json:"first,omitempty"`
	// Domain is what the claim's use is marked with (the pod's UID).
	Domain  string   `json:"domain,omitempty"`
	Devices []string `json:"devices"` // PCI addresses
	// Prepared: the kubelet prepared it; false for a claim taken at
	// allocation (allocations.go) whose pod was not prepared yet.
	Prepared bool `json:"prepared,omitempty"`
}

// checkpoint is the prepared claims by UID, in one JSON file of the
// plugin's data directory.
type checkpoint struct {
	path string
	mu   sync.Mutex
	m    map[string]prepared
}

const checkpointFile = "prepared.json"

// checkpointVersion guards the file's format.
const checkpointVersion = 1

type checkpointFileBody struct {
	Version  int                 `json:"version"`
	Prepared map[string]prepared `json:"prepared"`
}

func openCheckpoint(dir string) (*checkpoint, error) {
	cp := &checkpoint{path: filepath.Join(dir, checkpointFile), m: map[string]prepared{}}
	data, err := os.ReadFile(cp.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return cp, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", cp.path, err)
	}
	var body checkpointFileBody
	if err := json.Unmarshal(data, &body); err != nil {
		return nil, fmt.Errorf("%s is not a checkpoint of prepared claims (%v): move it aside; the driver then releases Kubernetes claims by their derived IDs", cp.path, err)
	}
	if body.Version != checkpointVersion {
		return nil, fmt.Errorf("%s has version %d; this gpuherd reads version %d", cp.path, body.Version, checkpointVersion)
	}
	// Its UIDs name files (the CDI specs) and its entries are released: an
	// entry the driver would not have written is damage, never acted on.
	for uid, p := range body.Prepared {
		if !validUID(types.UID(uid)) || !validObjectName(p.Namespace) || !validObjectName(p.Name) || p.Claim == "" {
			return nil, fmt.Errorf("%s holds an entry the driver does not write (UID %.80q, ResourceClaim %.80q/%.80q, claim %.80q): the file is damaged; move it aside, and the driver then releases Kubernetes claims by their derived IDs",
				cp.path, uid, p.Namespace, p.Name, p.Claim)
		}
	}
	if body.Prepared != nil {
		cp.m = body.Prepared
	}
	return cp, nil
}

// uids lists the ResourceClaims remembered.
func (cp *checkpoint) uids() []string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	out := make([]string, 0, len(cp.m))
	for uid := range cp.m {
		out = append(out, uid)
	}
	return out
}

func (cp *checkpoint) get(uid string) (prepared, bool) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	p, ok := cp.m[uid]
	return p, ok
}

// put records uid durably before it returns.
func (cp *checkpoint) put(uid string, p prepared) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	old, had := cp.m[uid]
	cp.m[uid] = p
	if err := cp.save(); err != nil {
		if had {
			cp.m[uid] = old
		} else {
			delete(cp.m, uid)
		}
		return err
	}
	return nil
}

func (cp *checkpoint) remove(uid string) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	old, had := cp.m[uid]
	if !had {
		return nil
	}
	delete(cp.m, uid)
	if err := cp.save(); err != nil {
		cp.m[uid] = old
		return err
	}
	return nil
}

func (cp *checkpoint) save() error {
	data, err := json.MarshalIndent(checkpointFileBody{Version: checkpointVersion, Prepared: cp.m}, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(cp.path, data, 0o600); err != nil {
		return fmt.Errorf("writing the checkpoint of prepared claims %s: %w", cp.path, err)
	}
	return nil
}
