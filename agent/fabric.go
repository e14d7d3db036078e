package agent

import "fmt"

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
)

// ParseFabricMode checks a fabric_mode value.
func ParseFabricMode(s string) (string, error) {
	switch s {
	case FabricAuto, FabricNone, FabricShared, FabricFullPassthrough:
		return s, nil
	}
	return "", fmt.Errorf("%q: use auto, none, shared-nvswitch or full-passthrough", s)
}

// fabricState is what the agent found out about its NVSwitch fabric.
type fabricState struct{}

func (a *Agent) detectFabric() error { return nil }
