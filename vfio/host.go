package vfio

import (
	"errors"
	"strconv"
	"strings"
)

// Where ReadHostFacts looks, relative to the sysfs root.
const (
	iommuClassDir     = "class/iommu"
	unsafeInterrupts  = "module/vfio_iommu_type1/parameters/allow_unsafe_interrupts"
	intelECAPIRBit    = 1 << 3 // Extended Capability Register: Interrupt Remapping support
	intelIOMMUECAP    = "intel-iommu/ecap"
	amdIOMMUPrefix    = "ivhd"
	intelIOMMUPrefix  = "dmar"
	vfioPCIDriverPath = pciDriversDir + "/" + DriverVFIO
)

// ReadHostFacts reads what the host offers passthrough as a whole:
// whether kernel/iommu_groups has groups, whether vfio-pci is loaded,
// interrupt remapping and vfio_iommu_type1's allow_unsafe_interrupts.
//
// Interrupt remapping is "on" when every Intel DMAR unit under class/iommu
// reports it in its extended capabilities (ecap bit 3) or the units are
// AMD-Vi (ivhd*), which remap whenever the IOMMU is on; "off" when a DMAR
// unit lacks it; "unknown" when there is no such unit (another IOMMU, or
// none). sysfs does not say whether the kernel turned a capable unit's
// remapping off (intremap=off); vfio's own refusal then still names it.
func (p *PCI) ReadHostFacts() HostFacts {
	h := HostFacts{InterruptRemapping: RemapUnknown}
	if groups, err := p.fs.ReadDir(iommuGroupDir); err == nil && len(groups) > 0 {
		h.IOMMUGroups = true
	}
	h.VFIOPCILoaded = p.fs.Exists(vfioPCIDriverPath)
	if b, err := p.fs.ReadFile(unsafeInterrupts); err == nil {
		v := strings.TrimSpace(string(b))
		h.UnsafeInterrupts = v == "Y" || v == "1"
	}
	units, err := p.fs.ReadDir(iommuClassDir)
	if err != nil {
		return h
	}
	intel, capable, amd := 0, 0, 0
	for _, u := range units {
		switch {
		case strings.HasPrefix(u, amdIOMMUPrefix):
			amd++
		case strings.HasPrefix(u, intelIOMMUPrefix):
			intel++
			b, err := p.fs.ReadFile(iommuClassDir + "/" + u + "/" + intelIOMMUECAP)
			if err != nil {
				continue
			}
			ecap, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 64)
			if err == nil && ecap&intelECAPIRBit != 0 {
				capable++
			}
		}
	}
	switch {
	case intel > 0 && capable == intel:
		h.InterruptRemapping = RemapOn
	case intel > 0:
		h.InterruptRemapping = RemapOff
	case amd > 0:
		h.InterruptRemapping = RemapOn
	}
	return h
}

// ResetFacts reads how the kernel can reset the function at addr:
// reset_method where the kernel has it, else whether a reset file exists.
func (p *PCI) ResetFacts(addr string) ResetFacts {
	if err := ValidateAddress(addr); err != nil {
		return ResetFacts{}
	}
	// Both files are visible only when the kernel can reset the function
	// (reset_method since Linux 5.15, reset before): neither means none.
	if b, err := p.fs.ReadFile(devicePath(addr, "reset_method")); err == nil {
		return ResetFacts{Known: true, Methods: strings.Fields(string(b))}
	}
	if p.fs.Exists(devicePath(addr, "reset")) {
		return ResetFacts{Known: true, Methods: []string{"reset"}}
	}
	if p.fs.Exists(devicePath(addr, "")) {
		return ResetFacts{Known: true}
	}
	return ResetFacts{}
}

// groupReadAttempts bounds the re-reads of a group that changed while it
// was read.
const groupReadAttempts = 3

// ReadinessConfig is the configuration Readiness applies.
type ReadinessConfig struct {
	Allow                 AllowList
	AllowUnsafeInterrupts bool
}

// Readiness reads the device at addr, its IOMMU group and the host, and
// returns Assess's verdict. host may be nil (it is read then); callers
// assessing many GPUs read it once. The error is for a device that cannot
// be read at all (a bad address, one that vanished): that is a health
// matter, not readiness.
func (p *PCI) Readiness(addr string, cfg ReadinessConfig, host *HostFacts) (Verdict, error) {
	d, err := p.Device(addr)
	if err != nil {
		return Verdict{}, err
	}
	in := ReadinessInput{GPU: d, Allow: cfg.Allow, AllowUnsafeInterrupts: cfg.AllowUnsafeInterrupts, Reset: p.ResetFacts(addr)}
	if host != nil {
		in.Host = *host
	} else {
		in.Host = p.ReadHostFacts()
	}
	if d.IOMMUGroup >= 0 {
		// A member that vanishes (or joins) between listing the group and
		// reading it is a hot-plug under way, not a broken group: read it
		// again; the uevent of the change follows anyway.
		for range groupReadAttempts {
			in.Members, in.MembersErr = p.GroupMembers(d.IOMMUGroup)
			if in.MembersErr == nil || !(errors.Is(in.MembersErr, ErrVanished) || errors.Is(in.MembersErr, ErrMalformed)) {
				break
			}
		}
	}
	return Assess(in), nil
}
