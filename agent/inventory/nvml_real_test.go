package inventory

import (
	"errors"
	"os"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestRealNVML runs the real library: on a host without the driver (CI) it
// must report ErrNVMLUnavailable, not crash; on a GPU host it must place
// every GPU at a sysfs address that exists.
func TestRealNVML(t *testing.T) {
	src := NewNVML(nvml.New(), nil)
	facts, err := src.Snapshot()
	if errors.Is(err, ErrNVMLUnavailable) {
		t.Skipf("no NVML here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := src.Shutdown(); err != nil {
			t.Error(err)
		}
	}()
	for addr, f := range facts {
		t.Logf("%s: %+v", addr, f)
		if _, err := os.Stat("/sys/bus/pci/devices/" + addr); err != nil {
			t.Errorf("NVML GPU at %s: no such sysfs device: %v", addr, err)
		}
		if f.UUID == "" || f.MemoryBytes == 0 {
			t.Errorf("%s: UUID or memory missing: %+v", addr, f)
		}
	}
}
