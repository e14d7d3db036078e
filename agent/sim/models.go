package sim

import (
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpuherd/gpuherd/vfio"
)

// model is what the simulation knows about one NVIDIA PCI device ID: enough to
// lay the card out in sysfs and to answer for it in NVML.
type model struct {
	device    uint16
	class     uint32
	audio     uint16 // device ID of the card's HD audio function
	nvml      gpus.Config
	idleWatts uint32 // power draw of an idle card on the host driver
}

// Device IDs of the functions that are not GPUs.
const (
	deviceNVSwitch     = 0x22a3 // third-generation NVSwitch (HGX H100/H200)
	deviceAudioAD102   = 0x22ba // HD audio of AD102 cards (L40S)
	deviceAudioGB202   = 0x22e8 // HD audio of GB202 cards (RTX PRO 6000 Blackwell)
	defaultAudioDevice = deviceAudioAD102
)

// withName returns base with the name, memory and PCI ID of a variant, keeping
// the MIG profiles of the go-nvml configuration it starts from.
func withName(base gpus.Config, name string, memoryMiB uint64, device uint16) gpus.Config {
	base.Name = name
	base.MemoryMB = memoryMiB
	base.PciDeviceId = uint32(device)<<16 | vfio.VendorNVIDIA
	return base
}

// models is the simulation's own table of cards. Names and memory sizes are
// what NVML reports on real hosts; the H100 SXM5 entry is go-nvml's own
// configuration so that a simulated DGX H100 agrees with its dgxh100 mock.
var models = []model{
	{device: 0x2330, class: vfio.Class3D, idleWatts: 72, nvml: gpus.H100_SXM5_80GB},
	{device: 0x2331, class: vfio.Class3D, idleWatts: 48, nvml: withName(gpus.H100_SXM5_80GB, "NVIDIA H100 PCIe", 81559, 0x2331)},
	{device: 0x2321, class: vfio.Class3D, idleWatts: 60, nvml: gpus.Config{
		Name: "NVIDIA H100 NVL", Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA,
		MemoryMB: 95830, CudaMajor: 9, CudaMinor: 0, PciDeviceId: 0x232110de,
	}},
	{device: 0x2335, class: vfio.Class3D, idleWatts: 76, nvml: withName(gpus.H200_SXM5_141GB, "NVIDIA H200", 143771, 0x2335)},
	{device: 0x20b5, class: vfio.Class3D, idleWatts: 45, nvml: withName(gpus.A100_PCIE_80GB, "NVIDIA A100 80GB PCIe", 81920, 0x20b5)},
	{device: 0x20b2, class: vfio.Class3D, idleWatts: 62, nvml: withName(gpus.A100_SXM4_80GB, "NVIDIA A100-SXM4-80GB", 81920, 0x20b2)},
	{device: 0x20b0, class: vfio.Class3D, idleWatts: 58, nvml: withName(gpus.A100_SXM4_40GB, "NVIDIA A100-SXM4-40GB", 40960, 0x20b0)},
	{device: 0x20f1, class: vfio.Class3D, idleWatts: 38, nvml: withName(gpus.A100_PCIE_40GB, "NVIDIA A100-PCIE-40GB", 40960, 0x20f1)},
	{device: 0x26b9, class: vfio.Class3D, audio: deviceAudioAD102, idleWatts: 34, nvml: gpus.Config{
		Name: "NVIDIA L40S", Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA,
		MemoryMB: 46068, CudaMajor: 8, CudaMinor: 9, PciDeviceId: 0x26b910de,
	}},
	{device: 0x2bb5, class: vfio.Class3D, audio: deviceAudioGB202, idleWatts: 41, nvml: gpus.Config{
		Name: "NVIDIA RTX PRO 6000 Blackwell Server Edition", Architecture: nvml.DEVICE_ARCH_BLACKWELL, Brand: nvml.BRAND_NVIDIA_RTX,
		MemoryMB: 97887, CudaMajor: 12, CudaMinor: 0, PciDeviceId: 0x2bb510de,
	}},
	{device: 0x2bb1, class: vfio.ClassVGA, audio: deviceAudioGB202, idleWatts: 29, nvml: gpus.Config{
		Name: "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", Architecture: nvml.DEVICE_ARCH_BLACKWELL, Brand: nvml.BRAND_NVIDIA_RTX,
		MemoryMB: 97887, CudaMajor: 12, CudaMinor: 0, PciDeviceId: 0x2bb110de,
	}},
	{device: 0x2bb4, class: vfio.ClassVGA, audio: deviceAudioGB202, idleWatts: 22, nvml: gpus.Config{
		Name: "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", Architecture: nvml.DEVICE_ARCH_BLACKWELL, Brand: nvml.BRAND_NVIDIA_RTX,
		MemoryMB: 97887, CudaMajor: 12, CudaMinor: 0, PciDeviceId: 0x2bb410de,
	}},
}

// modelByDevice returns the table entry for a PCI device ID.
func modelByDevice(device uint16) (model, bool) {
	for _, m := range models {
		if m.device == device {
			return m, true
		}
	}
	return model{}, false
}

// modelByName returns the table entry whose NVML name is name, ignoring case.
func modelByName(name string) (model, bool) {
	for _, m := range models {
		if strings.EqualFold(m.nvml.Name, name) {
			return m, true
		}
	}
	return model{}, false
}

// modelNames lists the NVML names the table knows, for error messages.
func modelNames() []string {
	names := make([]string, len(models))
	for i, m := range models {
		names[i] = m.nvml.Name
	}
	return names
}

// unknownModel describes a card missing from the table: NVML calls such a
// card "NVIDIA Graphics Device" until the driver learns its name.
func unknownModel(device uint16) model {
	return model{
		device:    device,
		class:     vfio.Class3D,
		audio:     defaultAudioDevice,
		idleWatts: 40,
		nvml: gpus.Config{
			Name: "NVIDIA Graphics Device", Architecture: nvml.DEVICE_ARCH_UNKNOWN, Brand: nvml.BRAND_NVIDIA,
			PciDeviceId: uint32(device)<<16 | vfio.VendorNVIDIA,
		},
	}
}
