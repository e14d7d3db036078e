package dra

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra/manifest"
	"github.com/gpuherd/gpuherd/vfio"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
)

// The standard attributes of KEP-5304 and the DRA device attribute
// package; virt-launcher reads pciBusID from the device metadata.
const (
	attrPCIBusID = resourceapi.QualifiedName("resource.kubernetes.io/pciBusID")
	attrNUMANode = resourceapi.QualifiedName("resource.kubernetes.io/numaNode")
	attrPCIeRoot = resourceapi.QualifiedName("resource.kubernetes.io/pcieRoot")
)

// gpuherd's own attributes, in the driver's domain. The DeviceClasses and
// pinned ResourceClaims select on model, node and claim (package
// manifest writes them).
const (
	attrModel      = manifest.AttrModel
	attrIOMMUGroup = "iommuGroup"
	attrUUID       = "uuid"
	attrNode       = manifest.AttrNode
	attrClaim      = manifest.AttrClaim
	capMemory      = "memory"
)

// DeviceName is the device name of the GPU at a PCI address in this
// driver's ResourceSlices: "gpu-0000-3b-00-0" (a DNS label).
func DeviceName(pciAddress string) string {
	r := strings.NewReplacer(":", "-", ".", "-")
	return "gpu-" + r.Replace(pciAddress)
}

// PCIAddress is the PCI address a device name stands for; false when name
// is not one of this driver's.
func PCIAddress(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "gpu-")
	// dddd-bb-ss-f
	if !ok || len(rest) != 12 || rest[4] != '-' || rest[7] != '-' || rest[10] != '-' {
		return "", false
	}
	addr := rest[:4] + ":" + rest[5:7] + ":" + rest[8:10] + "." + rest[11:]
	// The address must be one vfio takes, and the name this address's own:
	// "gpu-0:00-3b-00-0" has its separators in place but no address.
	if vfio.ValidateAddress(addr) != nil || DeviceName(addr) != name {
		return "", false
	}
	return addr, true
}

// published reports whether a GPU goes into this server's ResourceSlice,
// and with which gpuherd claim: a free GPU that can be passed through now
// (claim ""), and a GPU held by a claim made for Kubernetes (a prepared
// ResourceClaim, or a KubeVirt VM claimed first). A GPU held for anything
// else (a libvirt VM), or that is unhealthy, unusable, drained or still
// held open by a VM after its release, is not offered to Kubernetes.
func published(g api.GPU) (claim string, ok bool) {
	if g.Claim != "" {
		_, first := g.ClaimLabels[api.LabelKubernetes]
		_, prepared := g.ClaimLabels[api.LabelResourceClaimUID]
		return g.Claim, first || prepared
	}
	if g.State != api.StateFree {
		return "", false
	}
	if g.Readiness != nil && !g.Readiness.Ready {
		return "", false
	}
	return "", true
}

// Devices are the devices of this server's ResourceSlice: one per whole
// GPU (its IOMMU group's companion functions go with it), sorted by name.
func Devices(st api.Status, driver string) []resourceapi.Device {
	var out []resourceapi.Device
	for _, g := range st.GPUs {
		claim, ok := published(g)
		if !ok {
			continue
		}
		out = append(out, device(g, st.Node, claim, driver))
	}
	slices.SortFunc(out, func(a, b resourceapi.Device) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// device is one GPU as Kubernetes sees it. Every attribute is built here,
// and the device metadata handed to the VM at prepare is the same map.
func device(g api.GPU, node, claim, driver string) resourceapi.Device {
	return resourceapi.Device{
		Name:       DeviceName(g.PCIAddress),
		Attributes: attributes(g, node, claim, driver),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			resourceapi.QualifiedName(driver + "/" + capMemory): {Value: *resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI)},
		},
	}
}

func attributes(g api.GPU, node, claim, driver string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	own := func(name string) resourceapi.QualifiedName { return resourceapi.QualifiedName(driver + "/" + name) }
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		attrPCIBusID:        {StringValue: ptr.To(g.PCIAddress)},
		own(attrModel):      {StringValue: ptr.To(g.Model)},
		own(attrIOMMUGroup): {IntValue: ptr.To(int64(g.IOMMUGroup))},
		own(attrNode):       {StringValue: ptr.To(node)},
		own(attrClaim):      {StringValue: ptr.To(claim)},
	}
	if g.NUMANode >= 0 {
		attrs[attrNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
	}
	if g.PCIeRoot != "" {
		attrs[attrPCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.PCIeRoot)}
	}
	if g.UUID != "" {
		attrs[own(attrUUID)] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.UUID)}
	}
	return attrs
}

// validDriverName checks the driver name as Kubernetes will: a DNS
// subdomain in lower case, which also names the attribute domain.
func validDriverName(name string) error {
	if len(name) > resourceapi.DriverNameMaxLength {
		return fmt.Errorf("driver name %q: at most %d characters", name, resourceapi.DriverNameMaxLength)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("driver name %q: must be a DNS subdomain such as gpu.gpuherd.io (%s)", name, strings.Join(errs, "; "))
	}
	if !strings.Contains(name, ".") {
		return fmt.Errorf("driver name %q: must be a domain the operator owns, such as gpu.gpuherd.io", name)
	}
	return nil
}
