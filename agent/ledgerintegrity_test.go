package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// An agent whose ledger holds one GPU in two claims does not start, names
// the problem and what to do, and moves no driver first (issue 11, "Ledger
// integrity").
func TestStartRefusesAGPUInTwoClaims(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "a100-pcie-4", dir)
	a := startAgent(t, cfg, m, nil)
	c, err := a.Claim(context.Background(), "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: a100, Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	addr := c.GPUs[0].PCIAddress

	db, err := bolt.Open(cfg.LedgerPath(), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		v, _ := json.Marshal(map[string]any{"id": "vm-2", "state": "committed", "items": []api.Item{{Model: a100, Count: 1}},
			"gpus": []string{addr}, "created_at": time.Now(), "gpu_models": map[string]string{addr: a100}})
		return tx.Bucket([]byte("claims")).Put([]byte("vm-2"), v)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	// A free GPU off its idle driver: a start that got to reconcile would
	// move it.
	free := a.host.Addresses()[0]
	if free == addr {
		free = a.host.Addresses()[1]
	}
	if err := m.Kernel.WriteFile("bus/pci/devices/"+free+"/driver/unbind", []byte(free)); err != nil {
		t.Fatal(err)
	}
	writes := len(m.Kernel.Writes())

	_, err = New(context.Background(), cfg, quietLog(), WithSysfs(m.Kernel, m.NVML))
	if !errors.Is(err, ledger.ErrIntegrity) {
		t.Fatalf("start on a ledger with a GPU in two claims: %v, want ErrIntegrity", err)
	}
	for _, s := range []string{"vm-2", "vm-1", addr, "two claims", "gpuherd ledger remove-claim", cfg.LedgerPath()} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("start error %q lacks %q", err, s)
		}
	}
	if n := len(m.Kernel.Writes()); n != writes {
		t.Errorf("the refused start wrote %d times to sysfs: %v", n-writes, m.Kernel.Writes()[writes:])
	}
}
