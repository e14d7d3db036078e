package vfio

import (
	"fmt"
	"strings"
)

// Readiness for passthrough is decided in one place, Assess, from plain
// data: `gpuherd inventory`, the agent at start, the agent on every PCI
// event and every claim before it writes anything all call it, so they
// cannot disagree about a GPU on the same machine and configuration.

// Problem codes of a Verdict. Blocking ones keep a GPU from being offered;
// warning ones are reported and the GPU is still offered.
const (
	// ProblemNotAllowed: the GPU's own vendor:device is not on the allow list.
	ProblemNotAllowed = "not_allowed"
	// ProblemNoIOMMU: the GPU has no IOMMU group (the IOMMU is off).
	ProblemNoIOMMU = "no_iommu"
	// ProblemGroupUnreadable: a member of the group could not be read.
	ProblemGroupUnreadable = "group_unreadable"
	// ProblemGroupNotViable: another member keeps the group from vfio.
	ProblemGroupNotViable = "group_not_viable"
	// ProblemVFIOMissing: the vfio-pci driver is not loaded.
	ProblemVFIOMissing = "vfio_pci_missing"
	// ProblemNoInterruptRemapping: interrupt remapping is off or unknown.
	ProblemNoInterruptRemapping = "no_interrupt_remapping"
	// ProblemNoReset: the card has no reset method (a warning).
	ProblemNoReset = "no_reset"
)

// HostFacts is what the host as a whole offers passthrough; ReadHostFacts
// reads it from sysfs.
type HostFacts struct {
	// IOMMUGroups: kernel/iommu_groups lists at least one group.
	IOMMUGroups bool `json:"iommu_groups"`
	// VFIOPCILoaded: bus/pci/drivers/vfio-pci exists.
	VFIOPCILoaded bool `json:"vfio_pci_loaded"`
	// InterruptRemapping is "on", "off" or "unknown" (see ReadHostFacts).
	InterruptRemapping string `json:"interrupt_remapping"`
	// UnsafeInterrupts: vfio_iommu_type1's allow_unsafe_interrupts is set,
	// so vfio works without interrupt remapping.
	UnsafeInterrupts bool `json:"unsafe_interrupts"`
}

// Interrupt remapping states of HostFacts.
const (
	RemapOn      = "on"
	RemapOff     = "off"
	RemapUnknown = "unknown"
)

// ResetFacts is how the kernel can reset one function.
type ResetFacts struct {
	// Known: the kernel exposes reset_method (Linux 5.15 and later) or a
	// reset file; false on older kernels, where nothing can be said.
	Known bool `json:"known"`
	// Methods lists reset_method ("flr", "bus", "pm", ...); empty when
	// the kernel has none for the function.
	Methods []string `json:"methods,omitempty"`
}

// ReadinessInput is everything Assess looks at.
type ReadinessInput struct {
	Host HostFacts
	GPU  Device
	// Members is the GPU's IOMMU group, the GPU included; MembersErr says
	// why it could not be read.
	Members    []Device
	MembersErr error
	Reset      ResetFacts
	Allow      AllowList
	// AllowUnsafeInterrupts is the operator's consent (configuration key
	// allow_unsafe_interrupts) to pass GPUs through without interrupt
	// remapping.
	AllowUnsafeInterrupts bool
}

// PCIRef names a PCI function in a Problem; IDs and class are lower-case
// hex strings, as the JSON of every gpuherd interface writes them.
type PCIRef struct {
	PCIAddress string `json:"pci_address"`
	Vendor     string `json:"vendor"`
	Device     string `json:"device"`
	Class      string `json:"class"`
	Driver     string `json:"driver"` // "" when on no driver
}

func refOf(d Device) *PCIRef {
	return &PCIRef{PCIAddress: d.Address, Vendor: fmt.Sprintf("%04x", d.Vendor), Device: fmt.Sprintf("%04x", d.Device),
		Class: fmt.Sprintf("%06x", d.Class), Driver: d.Driver}
}

// String is "0000:41:00.1 [8086:1521] class 020000 on igb".
func (r PCIRef) String() string {
	return fmt.Sprintf("%s [%s:%s] class %s on %s", r.PCIAddress, r.Vendor, r.Device, r.Class, driverOrNone(r.Driver))
}

// Problem is one reason a GPU is not ready, or one warning about it.
type Problem struct {
	Code    string `json:"code"`
	Message string `json:"message"` // what is wrong
	Fix     string `json:"fix"`     // what the operator can do
	// Device is the function that blocks the GPU, when one does.
	Device *PCIRef `json:"blocking_device,omitempty"`
}

// String is the message and the fix in one line.
func (p Problem) String() string { return p.Message + "; " + p.Fix }

// Verdict is whether a GPU can be given to a VM now.
type Verdict struct {
	Blocking []Problem `json:"blocking,omitempty"`
	Warnings []Problem `json:"warnings,omitempty"`
}

// Ready reports whether nothing blocks the GPU.
func (v Verdict) Ready() bool { return len(v.Blocking) == 0 }

// Reason joins the blocking problems, each with its fix; "" when ready.
func (v Verdict) Reason() string {
	s := make([]string, len(v.Blocking))
	for i, p := range v.Blocking {
		s[i] = p.String()
	}
	return strings.Join(s, "; and ")
}

// Code is the first blocking problem's code, "" when ready: the metrics'
// reason label.
func (v Verdict) Code() string {
	if len(v.Blocking) == 0 {
		return ""
	}
	return v.Blocking[0].Code
}

// Equal reports whether two verdicts say the same.
func (v Verdict) Equal(o Verdict) bool { return v.Reason() == o.Reason() && warnText(v) == warnText(o) }

func warnText(v Verdict) string {
	s := make([]string, len(v.Warnings))
	for i, p := range v.Warnings {
		s[i] = p.String()
	}
	return strings.Join(s, "|")
}

const reloadHint = "then `systemctl reload gpuherd` (or wait: the agent follows PCI changes by itself)"

// Assess decides whether the GPU of in can be passed through to a VM: the
// IOMMU is on; its IOMMU group is viable (every other member is a bridge on
// pcieport, pci-stub or no driver, on the allow list, or a function on no
// driver, vfio-pci or pci-stub); vfio-pci is loaded; interrupt remapping is
// on, or the operator allowed unsafe interrupts and the kernel does too.
// A card the kernel cannot reset is a warning only.
func Assess(in ReadinessInput) Verdict {
	var v Verdict
	block := func(p Problem) { v.Blocking = append(v.Blocking, p) }
	warn := func(p Problem) { v.Warnings = append(v.Warnings, p) }
	g := in.GPU

	if !in.Allow.Allows(g.Vendor, g.Device) {
		block(Problem{Code: ProblemNotAllowed,
			Message: fmt.Sprintf("GPU %s [%04x:%04x] is not on allow_devices (%s)", g.Address, g.Vendor, g.Device, in.Allow),
			Fix:     fmt.Sprintf("add %04x:%04x (or %04x:*) to allow_devices, %s", g.Vendor, g.Device, g.Vendor, reloadHint)})
	}
	switch {
	case g.IOMMUGroup < 0:
		msg := "the GPU has no IOMMU group: the IOMMU is off"
		if in.Host.IOMMUGroups {
			msg = "the GPU has no IOMMU group although the host has some (the IOMMU skips this device)"
		}
		block(Problem{Code: ProblemNoIOMMU, Message: msg,
			Fix: "enable VT-d or AMD-Vi in the firmware and boot with intel_iommu=on or amd_iommu=on (iommu=pt is fine), then reboot"})
	case in.MembersErr != nil:
		block(Problem{Code: ProblemGroupUnreadable,
			Message: fmt.Sprintf("IOMMU group %d could not be read: %v", g.IOMMUGroup, in.MembersErr),
			Fix:     "check `ls -l /sys/kernel/iommu_groups/" + fmt.Sprint(g.IOMMUGroup) + "/devices`; the agent reads it again on the next PCI event"})
	default:
		for _, m := range in.Members {
			if m.Address == g.Address {
				continue
			}
			if ge := memberBlocks(g.IOMMUGroup, g, m, in.Allow); ge != nil {
				block(Problem{Code: ProblemGroupNotViable,
					Message: fmt.Sprintf("IOMMU group %d also holds %s: %s", g.IOMMUGroup, refOf(m), ge.what),
					Fix:     ge.fix, Device: refOf(m)})
			}
		}
	}
	if !in.Host.VFIOPCILoaded {
		block(Problem{Code: ProblemVFIOMissing, Message: "the vfio-pci driver is not loaded",
			Fix: "run `modprobe vfio-pci` (the package loads it at boot through /etc/modules-load.d/gpuherd-vfio.conf); if modprobe does not find it, install the kernel's modules package"})
	}
	switch {
	case in.Host.InterruptRemapping == RemapOn:
	case in.Host.InterruptRemapping == RemapUnknown:
		warn(Problem{Code: ProblemNoInterruptRemapping,
			Message: "could not tell whether interrupt remapping is on (no Intel DMAR or AMD-Vi unit in /sys/class/iommu)",
			Fix:     "check `dmesg | grep -i remapping`; without it vfio refuses to open the group unless vfio_iommu_type1 allow_unsafe_interrupts=1"})
	case !in.AllowUnsafeInterrupts:
		block(Problem{Code: ProblemNoInterruptRemapping,
			Message: "interrupt remapping is off: vfio refuses to give devices to a VM without it unless vfio_iommu_type1 allow_unsafe_interrupts=1, which lets a VM inject interrupts into the host",
			Fix:     "enable interrupt remapping (firmware and kernel: do not boot with intremap=off); to accept the risk instead, set allow_unsafe_interrupts: true in gpuherd.yaml and `options vfio_iommu_type1 allow_unsafe_interrupts=1` in /etc/modprobe.d"})
	case !in.Host.UnsafeInterrupts:
		block(Problem{Code: ProblemNoInterruptRemapping,
			Message: "interrupt remapping is off and vfio_iommu_type1 allow_unsafe_interrupts is not set, so vfio will refuse the group although gpuherd.yaml allows unsafe interrupts",
			Fix:     "add `options vfio_iommu_type1 allow_unsafe_interrupts=1` to /etc/modprobe.d and reload vfio_iommu_type1 (or write Y to /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts)"})
	default:
		warn(Problem{Code: ProblemNoInterruptRemapping,
			Message: "interrupt remapping is off; passthrough runs with allow_unsafe_interrupts, so a VM can inject interrupts into the host",
			Fix:     "enable interrupt remapping to remove the risk"})
	}
	if in.Reset.Known && len(in.Reset.Methods) == 0 {
		warn(Problem{Code: ProblemNoReset,
			Message: fmt.Sprintf("the kernel has no reset method for %s (no FLR, no bus reset): a VM's state can outlive it on the card, and a hung card needs a host reboot", g.Address),
			Fix:     "check `cat /sys/bus/pci/devices/" + g.Address + "/reset_method`; a bus reset needs the card alone behind its bridge; a firmware update may add FLR"})
	}
	return v
}

// memberProblem is why one group member blocks the group, and what to do.
type memberProblem struct{ what, fix string }

// memberBlocks decides whether member m of group keeps gpu's group from
// being given to a VM once every allow-listed endpoint is on vfio-pci. It
// is the rule Binder.plan applies before writing and Assess reports.
func memberBlocks(group int, gpu, m Device, allow AllowList) *memberProblem {
	allowed := allow.Allows(m.Vendor, m.Device)
	switch {
	case isBridge(m):
		if m.Driver != "" && m.Driver != DriverPCIePort && m.Driver != DriverPCIStub {
			return &memberProblem{what: "a bridge on a driver other than pcieport or pci-stub",
				fix: fmt.Sprintf("unbind it by hand if the host does not need it (echo %s > /sys/bus/pci/devices/%s/driver/unbind)", m.Address, m.Address)}
		}
	case !allowed:
		if m.Driver != "" && m.Driver != DriverVFIO && m.Driver != DriverPCIStub {
			what := fmt.Sprintf("not on allow_devices (%s) and bound to a host driver, so gpuherd will not unbind it", allow)
			if sameCard(gpu, m) {
				what = fmt.Sprintf("a function of the same card, not on allow_devices (%s), bound to a host driver", allow)
			}
			return &memberProblem{what: what,
				fix: fmt.Sprintf("if the host does not need it, unbind it (echo %s > /sys/bus/pci/devices/%s/driver/unbind; writing none to its driver_override first keeps every driver off it until reboot); "+
					"or move the GPU to a slot with its own IOMMU group (a switch port with ACS); or add %04x:%04x to allow_devices if gpuherd may give it to the VM too; %s",
					m.Address, m.Address, m.Vendor, m.Device, reloadHint)}
		}
	}
	return nil
}

// sameCard reports whether m is another function of gpu's card (same
// domain, bus and slot).
func sameCard(gpu, m Device) bool {
	return len(gpu.Address) == len("0000:00:00.0") && len(m.Address) == len(gpu.Address) && gpu.Address[:10] == m.Address[:10]
}
