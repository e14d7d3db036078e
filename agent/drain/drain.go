// Package drain keeps GPUs, or this whole server, from new claims while
// the claims they hold stay: a GPU's drain is in the ledger; the server's
// cordon is a file in the data directory, so that it survives restarts.
// It is built from named dependencies (Deps), never from the agent.
package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/atomicfile"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Ledger is where a GPU's drain is kept (*ledger.Ledger).
type Ledger interface {
	Drain(addr, reason string, now time.Time) error
	Undrain(addr string) error
}

// GPUs is this server's GPUs as the status API shows them.
type GPUs interface {
	// Known is nil when addr is one of this server's GPUs, else the API's
	// error for it.
	Known(addr string) error
	// GPU is the GPU at addr as the status shows it.
	GPU(addr string) (api.GPU, error)
}

// Deps is what Drains uses, by name.
type Deps struct {
	// Dir is the data directory, where the server's cordon is kept.
	Dir    string
	Ledger Ledger
	GPUs   GPUs
	// Self is this server as a member, the answer to a server drain.
	Self func() api.Member
	// APIError maps the ledger's errors to the API's.
	APIError func(error) error
	// Changed is called after every drain: a capacity change.
	Changed func()
	Clock   clock.Clock
	Log     *slog.Logger
}

// Drains drains and undrains this server's GPUs and the server itself.
type Drains struct {
	dir      string
	ledger   Ledger
	gpus     GPUs
	self     func() api.Member
	apiError func(error) error
	changed  func()
	clk      clock.Clock
	log      *slog.Logger

	mu      sync.RWMutex
	drained *serverDrain // nil when the server takes new claims
}

// serverDrain is a cordon on the whole server: no new claims, existing ones
// stay. It is kept in the data directory so it survives restarts.
type serverDrain struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

const serverDrainFile = "server-drain.json"

// Open builds Drains over d and reads the server's cordon, if any.
func Open(d Deps) (*Drains, error) {
	dr := &Drains{dir: d.Dir, ledger: d.Ledger, gpus: d.GPUs, self: d.Self, apiError: d.APIError,
		changed: d.Changed, clk: d.Clock, log: d.Log}
	path := filepath.Join(dr.dir, serverDrainFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return dr, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var sd serverDrain
	if err := json.Unmarshal(data, &sd); err != nil {
		return nil, fmt.Errorf("%s is corrupt (%v): fix or remove it (removing it undrains the server)", path, err)
	}
	dr.drained = &sd
	dr.log.Warn("server is drained: no new claims", "reason", sd.Reason, "since", sd.Since)
	return dr, nil
}

// Drain stops new claims on a GPU; a claim it is in stays.
func (dr *Drains) Drain(_ context.Context, addr, reason string) (api.GPU, error) {
	if err := dr.gpus.Known(addr); err != nil {
		return api.GPU{}, err
	}
	if len(reason) > 256 {
		return api.GPU{}, api.Invalid("reason", "drain reason longer than 256 bytes")
	}
	if err := dr.ledger.Drain(addr, reason, dr.clk.Now()); err != nil {
		return api.GPU{}, dr.apiError(err)
	}
	dr.log.Info("drained", "pci_address", addr, "reason", reason)
	dr.changed() // a capacity change: gossiped at once, like a claim
	return dr.gpus.GPU(addr)
}

// Undrain offers a drained GPU again.
func (dr *Drains) Undrain(_ context.Context, addr string) (api.GPU, error) {
	if err := dr.gpus.Known(addr); err != nil {
		return api.GPU{}, err
	}
	if err := dr.ledger.Undrain(addr); err != nil {
		return api.GPU{}, dr.apiError(err)
	}
	dr.log.Info("undrained", "pci_address", addr)
	dr.changed()
	return dr.gpus.GPU(addr)
}

// ServerDrained reports whether the whole server is cordoned; false on a
// nil Drains (the agent before it read the cordon).
func (dr *Drains) ServerDrained() bool {
	if dr == nil {
		return false
	}
	dr.mu.RLock()
	defer dr.mu.RUnlock()
	return dr.drained != nil
}

// DrainServer cordons this server: no new claims; existing claims stay.
func (dr *Drains) DrainServer(_ context.Context, reason string) (api.Member, error) {
	if len(reason) > 256 {
		return api.Member{}, api.Invalid("reason", "drain reason longer than 256 bytes")
	}
	d := serverDrain{Reason: reason, Since: dr.clk.Now().UTC()}
	data, _ := json.Marshal(d)
	if err := atomicfile.Write(filepath.Join(dr.dir, serverDrainFile), data, 0o600); err != nil {
		return api.Member{}, err
	}
	dr.mu.Lock()
	dr.drained = &d
	dr.mu.Unlock()
	dr.log.Info("server drained", "reason", reason)
	dr.changed()
	return dr.self(), nil
}

// UndrainServer lifts the cordon.
func (dr *Drains) UndrainServer(context.Context) (api.Member, error) {
	err := os.Remove(filepath.Join(dr.dir, serverDrainFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return api.Member{}, err
	}
	dr.mu.Lock()
	dr.drained = nil
	dr.mu.Unlock()
	dr.log.Info("server undrained")
	dr.changed()
	return dr.self(), nil
}
