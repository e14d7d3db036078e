package vfio

import "fmt"

// IdlePolicy says which driver a GPU rests on while no VM holds it.
type IdlePolicy string

const (
	// IdleVFIO keeps free GPUs on vfio-pci: the default, since passthrough
	// hosts often have no nvidia driver, and it makes the next claim fast.
	IdleVFIO IdlePolicy = "vfio-pci"
	// IdleNVIDIA returns free GPUs to their host drivers (nvidia for the GPU,
	// snd_hda_intel for its audio, ...), so NVML can check health between
	// tenants.
	IdleNVIDIA IdlePolicy = "nvidia"
	// IdleNone leaves free GPUs on no driver with driver_override cleared.
	// The override is cleared rather than set to "none" so that a later
	// drivers_probe, by gpuherd or by an operator, works without first
	// undoing gpuherd's state; the price is that a host driver loaded while
	// the GPU is free (modprobe nvidia) takes it, which the inventory then
	// shows.
	IdleNone IdlePolicy = "none"
)

// ParseIdlePolicy parses "vfio-pci", "nvidia" or "none".
func ParseIdlePolicy(s string) (IdlePolicy, error) {
	switch p := IdlePolicy(s); p {
	case IdleVFIO, IdleNVIDIA, IdleNone:
		return p, nil
	}
	return "", fmt.Errorf("vfio: idle driver policy %s: want %q, %q or %q", quote(s), IdleVFIO, IdleNVIDIA, IdleNone)
}

// String returns the policy's configuration value.
func (p IdlePolicy) String() string { return string(p) }

// UnmarshalText lets configuration files name the policy.
func (p *IdlePolicy) UnmarshalText(b []byte) error {
	v, err := ParseIdlePolicy(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}
