package host

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
)

// Fabric modes of an NVSwitch board (docs/design.md, "NVSwitch boards").
const (
	// FabricAuto detects the mode from where the NVSwitches are bound.
	FabricAuto = "auto"
	// FabricNone: no NVSwitch; every GPU stands alone.
	FabricNone = "none"
	// FabricShared: shared-NVSwitch multitenancy; Fabric Manager runs on the
	// host (or a service VM) and activates a partition per VM.
	FabricShared = "shared-nvswitch"
	// FabricFullPassthrough: GPUs and NVSwitches go to one VM together, which
	// runs Fabric Manager itself; only the whole board can be given out.
	FabricFullPassthrough = "full-passthrough"
	// FabricUnknown: NVSwitches with no driver, or on several drivers: the
	// fabric is not set up for either mode.
	FabricUnknown = "unknown"
)

// ParseFabricMode checks a fabric_mode value.
func ParseFabricMode(s string) (string, error) {
	switch s {
	case FabricAuto, FabricNone, FabricShared, FabricFullPassthrough:
		return s, nil
	}
	return "", fmt.Errorf("%q: use auto, none, shared-nvswitch or full-passthrough", s)
}

// sharedPartitionSizes are the GPU counts of Fabric Manager's partitions on
// an 8-GPU HGX/DGX baseboard in shared-NVSwitch mode (16 on a two-board
// HGX-2/A100 system).
var sharedPartitionSizes = []int{1, 2, 4, 8, 16}

// Fabric is what a server's PCI devices say about its NVSwitch fabric.
type Fabric struct {
	// Mode is none, shared-nvswitch, full-passthrough or unknown.
	Mode string `json:"mode"`
	// Stated is true when fabric_mode set Mode rather than detection.
	Stated bool `json:"stated"`
	// Detected is what the NVSwitches' drivers say, whatever was stated.
	Detected string `json:"detected"`
	// Switches are the NVSwitch functions (class 0x0680, 10de:1af1/22a3).
	Switches []vfio.Device `json:"switches"`
	// Why explains Mode in one sentence; Warning is set when the board
	// cannot give NVLink to a multi-GPU VM as it stands.
	Why     string `json:"why"`
	Warning string `json:"warning,omitempty"`
}

// isNVSwitch recognises an NVSwitch function: NVIDIA's, of class 0x0680, or
// one of the catalog's non-GPU device IDs.
func isNVSwitch(d vfio.Device, cat *inventory.Catalog) bool {
	return d.Vendor == vfio.VendorNVIDIA && !d.VirtualFunction &&
		(d.Class>>8 == vfio.ClassNVSwitch>>8 || cat.IsNonGPU(d.Device))
}

// DetectFabric finds the NVSwitches among devs and the mode they are run
// in: on nvidia, the host's Fabric Manager runs the fabric (shared-NVSwitch
// multitenancy); on vfio-pci, they go to a VM (full passthrough). stated,
// when not auto, wins over detection; a disagreement is a warning.
func DetectFabric(devs []vfio.Device, cat *inventory.Catalog, stated string) Fabric {
	var f Fabric
	drivers := map[string]bool{}
	for _, d := range devs {
		if isNVSwitch(d, cat) {
			f.Switches = append(f.Switches, d)
			drivers[d.Driver] = true
		}
	}
	n := len(f.Switches)
	switch {
	case n == 0:
		f.Detected, f.Why = FabricNone, "no NVSwitch: every GPU stands alone"
	case len(drivers) == 1 && drivers[vfio.DriverNVIDIA]:
		f.Detected = FabricShared
		f.Why = fmt.Sprintf("%d NVSwitches on the host's nvidia driver: Fabric Manager runs here and activates one partition (1, 2, 4 or 8 GPUs) per VM", n)
	case len(drivers) == 1 && drivers[vfio.DriverVFIO]:
		f.Detected = FabricFullPassthrough
		f.Why = fmt.Sprintf("%d NVSwitches on vfio-pci: they go to a VM with the whole board, which runs Fabric Manager itself", n)
	case len(drivers) == 1 && drivers[""]:
		f.Detected = FabricUnknown
		f.Why = fmt.Sprintf("%d NVSwitches with no driver: nothing runs the fabric", n)
	default:
		keys := make([]string, 0, len(drivers))
		for d := range drivers {
			keys = append(keys, OrNone(d))
		}
		slices.Sort(keys)
		f.Detected = FabricUnknown
		f.Why = fmt.Sprintf("%d NVSwitches on several drivers (%s)", n, strings.Join(keys, ", "))
	}
	f.Mode = f.Detected
	if stated != "" && stated != FabricAuto {
		f.Mode, f.Stated = stated, true
		if stated != f.Detected {
			f.Warning = fmt.Sprintf("fabric_mode says %s but detection says %s (%s)", stated, f.Detected, f.Why)
		}
		f.Why = "stated by fabric_mode; detected: " + f.Why
	}
	switch f.Mode {
	case FabricUnknown:
		f.Warning = strings.TrimPrefix(f.Warning+"; ", "; ") + "multi-GPU VMs get no NVLink: start nvidia-fabricmanager on the host (shared-NVSwitch mode) or set fabric_mode"
	case FabricFullPassthrough:
		f.Warning = strings.TrimPrefix(f.Warning+"; ", "; ") + "gpuherd hands out GPUs, never NVSwitches: multi-GPU VMs get no NVLink in this mode"
	}
	return f
}

// fabricState is the fabric this agent found at start.
type fabricState struct {
	f Fabric
}

// detectFabric looks at the NVSwitches once, at start, and says which mode
// this server runs in.
func (h *Host) FindFabric() error {
	devs, err := h.pci.Devices()
	if err != nil {
		return fmt.Errorf("listing PCI devices for the NVSwitch fabric: %w", err)
	}
	h.fabric.f = DetectFabric(devs, h.inv.Catalog(), h.cfg.FabricMode)
	f := h.fabric.f
	if f.Mode == FabricNone {
		return nil
	}
	attrs := []any{"mode", f.Mode, "nvswitches", len(f.Switches), "why", f.Why}
	if f.Warning != "" {
		h.log.Warn("NVSwitch fabric", append(attrs, "warning", f.Warning)...)
	} else {
		h.log.Info("NVSwitch fabric", attrs...)
	}
	return nil
}

// Fabric is this server's NVSwitch fabric as found at start.
func (h *Host) Fabric() Fabric { return h.fabric.f }

// checkFabric decides whether a request of n GPUs can be served with working
// NVLink on this board. A mode stated in fabric_mode is enforced: a request
// the board cannot serve is refused as not available here, so coordinators
// try another server. A detected mode only warns: detection reads drivers,
// not Fabric Manager's configuration.
func (h *Host) CheckFabric(claim string, items []ledger.Item) error {
	f := h.fabric.f
	n := 0
	for _, it := range items {
		n += it.Count
	}
	if n <= 1 || f.Mode == FabricNone {
		return nil
	}
	var why string
	switch f.Mode {
	case FabricShared:
		if slices.Contains(sharedPartitionSizes, n) {
			return nil
		}
		why = fmt.Sprintf("%d GPUs are not one Fabric Manager partition (shared-NVSwitch mode partitions hold 1, 2, 4 or 8 GPUs): NVLink would not join them", n)
	case FabricFullPassthrough:
		why = fmt.Sprintf("%d GPUs without their NVSwitches get no NVLink (full-passthrough mode: gpuherd never hands out NVSwitches)", n)
	default:
		why = fmt.Sprintf("%d GPUs would get no NVLink: %s", n, f.Warning)
	}
	if !f.Stated {
		h.log.Warn("claim served without full NVLink", "claim", claim, "fabric", f.Mode, "why", why)
		return nil
	}
	h.log.Warn("claim refused: the NVSwitch fabric cannot serve it", "claim", claim, "fabric", f.Mode, "why", why)
	return &api.Error{Code: api.CodeNotAvailable,
		Message: fmt.Sprintf("%s cannot serve claim %s: %s", h.cfg.NodeName, claim, why)}
}
