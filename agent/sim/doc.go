// Package sim is the simulated hardware behind `gpuherd agent --simulate
// PROFILE`: a profile describes a GPU server, Start boots it as an in-memory
// fakekernel.Kernel whose state outlives the agent process, and NVML answers
// for its cards through go-nvml's mocks, seeing only the cards the nvidia
// driver holds.
//
// # Profiles
//
// A profile is a YAML file (or one of the built-ins, see Names) describing one
// server compactly. Unknown keys are rejected, and every error names the key
// path (gpus[1].count: must be between 1 and 64).
//
//	name: my-server                       # required; letters, digits, '.', '_', '-'
//	description: two L40S and an H100 PCIe
//	host_drivers: [nvidia, snd_hda_intel] # loaded host drivers; vfio-pci always is
//	nvml: true                            # NVML answers (needs nvidia loaded)
//	gpus:
//	  - device: "26b9"        # PCI device ID, vendor 10de; or model: "NVIDIA L40S"
//	    count: 2              # 1 to 64; default 1
//	    numa_node: 0          # 0 or 1; default: spread, first half on node 0
//	    audio: true           # adds the card's HD audio function at .1, same IOMMU group
//	    memory_mib: 46068     # NVML total memory; default from the model table
//	    name: "NVIDIA L40S"   # NVML name; default from the model table
//	    driver: nvidia        # at boot: a loaded driver, vfio-pci or none;
//	                          # default nvidia when loaded, else none
//	    address: 0000:3b:00.0 # only with count 1; default from the address plan
//	  - device: "2331"
//	nvswitches: 0             # 0 to 8 NVSwitches, 10de:22a3 class 0x068000
//	extra_devices:            # anything else, e.g. a host NVMe in a GPU's IOMMU group
//	  - {address: "0000:5e:00.0", vendor: "144d", device: "a808", class: "010802",
//	     driver: nvme, iommu_group_of: "0000:5d:00.0"}
//
// Hex IDs may be written with or without 0x. An extra device's driver is none
// unless given; its NUMA node follows its bus unless numa_node is given;
// iommu_group_of names a GPU, an NVSwitch or an extra device that has its own
// group. The model table knows the H100 (SXM5 2330, PCIe 2331, NVL 2321),
// H200 2335, A100 (20b0, 20b2, 20b5, 20f1), L40S 26b9 and RTX PRO 6000
// Blackwell (2bb1, 2bb4, 2bb5); a card it does not know is simulated all the
// same, named "NVIDIA Graphics Device", and needs memory_mib when nvml is on.
//
// # Layout
//
// Addresses follow real two-socket servers. GPU slot i of NUMA node n sits on
// bus B[n][i%4] + i/4, function 0, with B = {18, 2a, 3a, 5d} on node 0 and
// {9a, ab, ba, db} on node 1 (those of a DGX H100), skipping buses other
// devices use; NVSwitches sit on buses 05, 06, ... of node 0. Every GPU has one
// IOMMU group with its audio function, every NVSwitch and every other device
// its own, unless iommu_group_of joins one; groups are numbered from 16 in
// address order, as root ports and bridges take the low numbers on a real
// server. The audio function is on snd_hda_intel when that is loaded (on
// vfio-pci with a card that boots on vfio-pci), NVSwitches on nvidia when
// that is loaded. A GPU's UUID and serial are derived from the profile name
// and its address, so they survive restarts of the simulation.
package sim
