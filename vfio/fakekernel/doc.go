// Package fakekernel is an in-memory Linux PCI and vfio subsystem: the
// kernel of a simulated machine. Its Kernel implements vfio.FS with the
// sysfs layout, store semantics and errno values of the real one, serves a
// /proc of simulated QEMU processes (vfio.ProcFS) and PCI uevents
// (vfio.PCIEventSource), and injects the faults real cards show (Hold,
// Remove, SetConfigAllOnes, Add, interrupt remapping off).
//
// It is product code as well as test support: `gpuherd agent --simulate`
// runs on a Kernel opened from a state file (Open), so that the simulated
// machine outlives the agent process, and the tests of vfio, agent and
// cmd/gpuherd boot one in memory (New). Package vfio does not import it.
package fakekernel
