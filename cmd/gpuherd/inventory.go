package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// scanGPU is one GPU of `gpuherd inventory`: what the agent would manage and
// whether its IOMMU group can be given to a VM.
type scanGPU struct {
	inventory.GPU
	Viable    bool           `json:"viable"`
	Reason    string         `json:"reason,omitempty"`
	Readiness *api.Readiness `json:"readiness,omitempty"` // the agent's verdict, the same function
	Members   []vfio.Device  `json:"iommu_group_members"`
}

type scanReport struct {
	SysfsRoot string         `json:"sysfs_root"`
	Host      vfio.HostFacts `json:"host"`
	Config    string         `json:"config,omitempty"` // the configuration whose lists were applied
	GPUs      []scanGPU      `json:"gpus"`
	// Denied are GPUs on the configuration's deny_devices: never managed.
	Denied []string `json:"denied"`
	// Fabric is the NVSwitch fabric mode and how it was found.
	Fabric     host.Fabric   `json:"fabric"`
	NotOffered []vfio.Device `json:"not_offered"` // NVIDIA functions that are never GPUs (NVSwitches, companions)
}

func newInventoryCmd(g *globals) *cobra.Command {
	var (
		root, simulate, configPath string
		allow                      []string
		unsafeIRQ                  bool
	)
	cmd := &cobra.Command{
		Use:   "inventory",
		Short: "Read-only scan: the GPUs gpuherd would manage here and whether they can be passed through",
		Long: `Scan sysfs without an agent and without writing anything: every NVIDIA GPU,
its IOMMU group with every member, and whether the group can be passed through
to a VM or why gpuherd would refuse it. Run it before enabling the service.
--sysfs-root scans any directory laid out like /sys; --simulate scans a
simulated profile. It reads the agent's configuration (--config, by default
/etc/gpuherd/gpuherd.yaml when it exists) for allow_devices, deny_devices,
gpu_devices, models, sysfs_root, simulate and allow_unsafe_interrupts, so it
shows what the agent would manage after an edit, with the agent's own verdict
(the same function); flags given on the command line win.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, used, err := inventoryConfig(cmd, configPath)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("allow-devices") {
				cfg.AllowDevices = allow
			}
			if cmd.Flags().Changed("allow-unsafe-interrupts") {
				cfg.AllowUnsafeInterrupts = unsafeIRQ
			}
			if cmd.Flags().Changed("sysfs-root") {
				cfg.SysfsRoot, cfg.Simulate = root, ""
			}
			if cmd.Flags().Changed("simulate") {
				cfg.Simulate = simulate
			}
			root, simulate, allow = cfg.SysfsRoot, cfg.Simulate, cfg.AllowDevices
			al, err := vfio.ParseAllowList(allow)
			if err != nil {
				return cli.Usagef("--allow-devices: %v", err)
			}
			var fs vfio.FS
			shown := root
			if simulate != "" {
				p, err := sim.Load(simulate)
				if err != nil {
					return cli.Usagef("--simulate: %v", err)
				}
				k, err := fakekernel.New(p.KernelConfig())
				if err != nil {
					return err
				}
				fs, shown = k, "simulated:"+p.Name
			} else {
				fs = vfio.NewOSFS(root, "/dev")
			}
			cat, err := cfg.Catalog()
			if err != nil {
				return err
			}
			gpuIDs, _ := vfio.ParseAllowList(cfg.GPUDevices)
			rep, err := scan(fs, vfio.ReadinessConfig{Allow: al, AllowUnsafeInterrupts: cfg.AllowUnsafeInterrupts},
				inventory.WithCatalog(cat), inventory.WithDenyAddresses(cfg.DenyDevices), inventory.WithGPUDevices(gpuIDs))
			if err != nil {
				return err
			}
			rep.SysfsRoot, rep.Config = shown, used
			devs, err := vfio.New(fs).Devices()
			if err != nil {
				return err
			}
			rep.Fabric = host.DetectFabric(devs, cat, cfg.FabricMode)
			return g.show(rep, func(w *tabwriter.Writer) { printScan(w, rep) })
		},
	}
	cmd.Flags().StringVar(&root, "sysfs-root", "/sys", "directory laid out like /sys")
	cmd.Flags().StringVar(&simulate, "simulate", "", "scan a simulated profile instead")
	cmd.Flags().StringSliceVar(&allow, "allow-devices", []string{"10de:*"}, "vendor:device IDs gpuherd may bind")
	cmd.Flags().BoolVar(&unsafeIRQ, "allow-unsafe-interrupts", false, "accept a host without interrupt remapping (the agent's allow_unsafe_interrupts)")
	cmd.Flags().StringVar(&configPath, "config", "", "the agent's YAML configuration (default "+defaultConfigPath+" when it exists)")
	return cmd
}

// inventoryConfig is the agent's configuration the scan applies: the file
// named by --config, else the packaged one when it exists, else defaults.
func inventoryConfig(cmd *cobra.Command, path string) (agent.Config, string, error) {
	cfg := agent.DefaultConfig()
	if !cmd.Flags().Changed("config") {
		if _, err := os.Stat(defaultConfigPath); err != nil {
			return cfg, "", nil
		}
		path = defaultConfigPath
	}
	if err := agent.LoadConfigFile(path, &cfg); err != nil {
		return cfg, "", err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, "", err
	}
	return cfg, path, nil
}

func scan(fs vfio.FS, cfg vfio.ReadinessConfig, opts ...inventory.Option) (scanReport, error) {
	pci := vfio.New(fs)
	inv := inventory.New(pci, opts...)
	gpus, err := inv.Discover()
	if err != nil {
		return scanReport{}, err
	}
	rep := scanReport{GPUs: []scanGPU{}, NotOffered: []vfio.Device{}, Denied: []string{}, Host: pci.ReadHostFacts()}
	isGPU := map[string]bool{}
	for _, gp := range gpus {
		isGPU[gp.Address] = true
		s := scanGPU{GPU: gp, Viable: true}
		if gp.IOMMUGroup >= 0 {
			s.Members, _ = pci.GroupMembers(gp.IOMMUGroup)
		}
		v, err := pci.Readiness(gp.Address, cfg, &rep.Host)
		switch {
		case err != nil:
			s.Viable, s.Reason = false, err.Error()
		case !v.Ready():
			s.Viable, s.Reason = false, v.Reason()
		case !gp.Healthy:
			s.Viable, s.Reason = false, gp.Health
		}
		if err == nil {
			s.Readiness = host.ReadinessView(v)
		}
		rep.GPUs = append(rep.GPUs, s)
	}
	devs, err := pci.Devices()
	if err != nil {
		return scanReport{}, err
	}
	for _, d := range devs {
		switch {
		case inv.Denied(d.Address):
			rep.Denied = append(rep.Denied, d.Address)
		case d.Vendor == vfio.VendorNVIDIA && !isGPU[d.Address]:
			rep.NotOffered = append(rep.NotOffered, d)
		}
	}
	return rep, nil
}

func printScan(w *tabwriter.Writer, rep scanReport) {
	viable := 0
	for _, s := range rep.GPUs {
		if s.Viable {
			viable++
		}
	}
	fmt.Fprintf(w, "%d NVIDIA GPU(s) in %s, %d ready for passthrough\n", len(rep.GPUs), rep.SysfsRoot, viable)
	fmt.Fprintf(w, "NVSwitch fabric: %s (%s)\n", rep.Fabric.Mode, rep.Fabric.Why)
	if rep.Fabric.Warning != "" {
		fmt.Fprintf(w, "  warning: %s\n", rep.Fabric.Warning)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "PCI ADDRESS\tMODEL\tNUMA\tGROUP\tDRIVER\tPASSTHROUGH")
	for _, s := range rep.GPUs {
		verdict := "ready"
		switch {
		case s.Readiness != nil && !s.Readiness.Ready:
			verdict = "unusable"
		case !s.Viable:
			verdict = "unhealthy"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Address, s.Model, intOrDash(s.NUMANode), intOrDash(s.IOMMUGroup), dash(s.Driver), verdict)
	}
	w.Flush()
	for _, s := range rep.GPUs {
		fmt.Fprintf(w, "\n%s, IOMMU group %s:\n", s.Address, intOrDash(s.IOMMUGroup))
		for _, m := range s.Members {
			fmt.Fprintf(w, "  %s  [%04x:%04x] class %06x  driver %s\n", m.Address, m.Vendor, m.Device, m.Class, dash(m.Driver))
		}
		switch {
		case s.Readiness != nil && (len(s.Readiness.Blocking) > 0 || len(s.Readiness.Warnings) > 0):
			printVerdict(w, " ", s.Readiness)
		case !s.Viable:
			fmt.Fprintf(w, "  unhealthy: %s\n", strings.TrimPrefix(s.Reason, "vfio: "))
		}
	}
	if len(rep.Denied) > 0 {
		fmt.Fprintf(w, "\nDenied by deny_devices in %s (never managed): %s\n", rep.Config, strings.Join(rep.Denied, ", "))
	}
	if len(rep.NotOffered) > 0 {
		fmt.Fprintln(w, "\nNVIDIA functions never offered as GPUs (NVSwitches, audio/USB companions):")
		for _, d := range rep.NotOffered {
			fmt.Fprintf(w, "  %s  [%04x:%04x] class %06x  driver %s\n", d.Address, d.Vendor, d.Device, d.Class, dash(d.Driver))
		}
	}
}
