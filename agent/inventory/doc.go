// Package inventory finds the NVIDIA GPUs of this server and names them.
//
// sysfs comes first: a card bound to vfio-pci is invisible to the host
// driver and to NVML, and a passthrough host often has no nvidia driver at
// all, so the list of GPUs, their model (from the catalog in models.yaml, by
// PCI device ID), IOMMU group and companions always come from sysfs. NVML
// comes second: where it answers it adds UUID, serial, exact memory, NUMA
// and topology, and what it said is cached by PCI address so that it
// survives the card's time on vfio-pci and agent restarts.
//
// A GPU's identity is its PCI address; UUIDs are descriptive only.
package inventory
