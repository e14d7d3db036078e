package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/atomicfile"
)

// Drain stops new claims on a GPU; a claim it is in stays.
func (a *Agent) Drain(_ context.Context, addr, reason string) (api.GPU, error) {
	if err := a.status.Known(addr); err != nil {
		return api.GPU{}, err
	}
	if len(reason) > 256 {
		return api.GPU{}, api.Invalid("reason", "drain reason longer than 256 bytes")
	}
	if err := a.ledger.Drain(addr, reason, a.clk.Now()); err != nil {
		return api.GPU{}, a.apiError(err)
	}
	a.log.Info("drained", "pci_address", addr, "reason", reason)
	a.changed() // a capacity change: gossiped at once, like a claim
	return a.status.GPU(addr)
}

// Undrain offers a drained GPU again.
func (a *Agent) Undrain(_ context.Context, addr string) (api.GPU, error) {
	if err := a.status.Known(addr); err != nil {
		return api.GPU{}, err
	}
	if err := a.ledger.Undrain(addr); err != nil {
		return api.GPU{}, a.apiError(err)
	}
	a.log.Info("undrained", "pci_address", addr)
	a.changed()
	return a.status.GPU(addr)
}

// serverDrain is a cordon on the whole server: no new claims, existing ones
// stay. It is kept in the data directory so it survives restarts.
type serverDrain struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

const serverDrainFile = "server-drain.json"

func (a *Agent) loadServerDrain() error {
	path := filepath.Join(a.cfg.DataDir, serverDrainFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	var d serverDrain
	if err := json.Unmarshal(data, &d); err != nil {
		return fmt.Errorf("%s is corrupt (%v): fix or remove it (removing it undrains the server)", path, err)
	}
	a.drained = &d
	a.log.Warn("server is drained: no new claims", "reason", d.Reason, "since", d.Since)
	return nil
}

func (a *Agent) serverDrained() bool {
	a.drainMu.RLock()
	defer a.drainMu.RUnlock()
	return a.drained != nil
}

// DrainServer cordons this server: no new claims; existing claims stay.
func (a *Agent) DrainServer(_ context.Context, reason string) (api.Member, error) {
	if len(reason) > 256 {
		return api.Member{}, api.Invalid("reason", "drain reason longer than 256 bytes")
	}
	d := serverDrain{Reason: reason, Since: a.clk.Now().UTC()}
	data, _ := json.Marshal(d)
	if err := atomicfile.Write(filepath.Join(a.cfg.DataDir, serverDrainFile), data, 0o600); err != nil {
		return api.Member{}, err
	}
	a.drainMu.Lock()
	a.drained = &d
	a.drainMu.Unlock()
	a.log.Info("server drained", "reason", reason)
	a.changed()
	return a.self(), nil
}

// UndrainServer lifts the cordon.
func (a *Agent) UndrainServer(context.Context) (api.Member, error) {
	err := os.Remove(filepath.Join(a.cfg.DataDir, serverDrainFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return api.Member{}, err
	}
	a.drainMu.Lock()
	a.drained = nil
	a.drainMu.Unlock()
	a.log.Info("server undrained")
	a.changed()
	return a.self(), nil
}
