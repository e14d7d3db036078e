package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gpuherd/gpuherd/internal/atomicfile"
	"os"
	"path/filepath"

	"github.com/gpuherd/gpuherd/agent/api"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The CDI side of a prepared claim: the container runtime gives the
// launcher pod /dev/vfio/vfio and the /dev/vfio/<group> of each of its
// GPUs, the devices QEMU opens. One spec file per ResourceClaim, named
// after its UID so that a runtime's cache never serves a stale one.

// cdiClass is the CDI class of the VFIO devices: IDs read
// "<driver>/vfio=<claim UID>-<device>".
const cdiClass = "vfio"

// vfioContainer is where QEMU finds the VFIO container device.
const vfioContainer = "/dev/vfio/vfio"

func (d *Driver) cdiSpecPath(claimUID string) string {
	return filepath.Join(d.cfg.CDIDir, fmt.Sprintf("%s_%s_%s.json", d.cfg.DriverName, cdiClass, claimUID))
}

func cdiDeviceName(claimUID, device string) string { return claimUID + "-" + device }

func (d *Driver) cdiID(claimUID, device string) string {
	return d.cfg.DriverName + "/" + cdiClass + "=" + cdiDeviceName(claimUID, device)
}

// writeCDISpec writes the spec of one ResourceClaim's GPUs, atomically.
func (d *Driver) writeCDISpec(claimUID string, gpus []api.ClaimGPU) error {
	spec := cdispec.Spec{Version: "0.5.0", Kind: d.cfg.DriverName + "/" + cdiClass}
	for _, g := range gpus {
		if g.VFIODevice == "" {
			return fmt.Errorf("GPU %s has no VFIO device: it is not on vfio-pci", g.PCIAddress)
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: cdiDeviceName(claimUID, DeviceName(g.PCIAddress)),
			ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{
				{Path: vfioContainer, HostPath: d.hostDev(vfioContainer)},
				{Path: g.VFIODevice, HostPath: d.hostDev(g.VFIODevice)},
			}},
		})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.cfg.CDIDir, 0o755); err != nil {
		return err
	}
	return atomicfile.Write(d.cdiSpecPath(claimUID), data, 0o644)
}

// hostDev is where a /dev path is on this host: under dev_root when the
// agent runs on one (simulated hardware, a container).
func (d *Driver) hostDev(path string) string {
	if d.cfg.DevRoot == "" || d.cfg.DevRoot == "/dev" {
		return path
	}
	rel, err := filepath.Rel("/dev", path)
	if err != nil {
		return path
	}
	return filepath.Join(d.cfg.DevRoot, rel)
}

func (d *Driver) removeCDISpec(claimUID string) error {
	if err := os.Remove(d.cdiSpecPath(claimUID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the CDI spec of ResourceClaim %s: %w", claimUID, err)
	}
	return nil
}
