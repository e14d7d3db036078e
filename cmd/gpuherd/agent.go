package main

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
	"github.com/gpuherd/gpuherd/systemd"
	"github.com/gpuherd/gpuherd/vfio"
)

func newAgentCmd(g *globals) *cobra.Command {
	var (
		configPath string
		clockFile  string
		f          agent.Config
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the gpuherd daemon on this server",
		Long: `Run the daemon: discover this server's GPUs, open the claims ledger, make the
machine agree with it (every claimed GPU on vfio-pci, free GPUs on the idle
driver), then serve the local API on --socket.

Settings come from the defaults, then --config (YAML), then flags.
--simulate PROFILE runs on simulated hardware (built-in profiles: dgx-h100,
l40s-4, a100-pcie-4, rtx6000pro-2, mixed; or a profile file); the simulated
machine's state lives in --data-dir and outlives the agent, as a real one does.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cli.LoadConfig(configPath)
			if err != nil {
				return err
			}
			applyAgentFlags(cmd.Flags(), &f, &cfg)
			if err := cfg.Validate(); err != nil {
				return err
			}
			var opts []agent.Option
			if clockFile != "" {
				opts = append(opts, agent.WithWallClock(offsetClock(clockFile)))
			}
			return runAgent(cmd.Context(), g, cfg, configPath, func(c *agent.Config) error {
				applyAgentFlags(cmd.Flags(), &f, c)
				return nil
			}, opts...)
		},
	}
	fl := cmd.Flags()
	d := agent.DefaultConfig()
	fl.StringVar(&configPath, "config", "", "YAML configuration file")
	// Test only: the fault runs play a clock step by writing an offset
	// ("-90s") into this file; the agent reads its wall clock through it.
	fl.StringVar(&clockFile, "clock-offset-file", "", "test only: a file holding an offset added to the wall clock")
	_ = fl.MarkHidden("clock-offset-file")
	fl.StringVar(&f.NodeName, "node-name", d.NodeName, "this server's name")
	fl.StringVar(&f.DataDir, "data-dir", d.DataDir, "directory of the ledger (and the simulated machine)")
	fl.StringVar(&f.Socket, "socket", d.Socket, "unix socket of the local API")
	fl.StringVar(&f.SocketGroup, "socket-group", "", "group allowed to use the socket (mode 0660)")
	fl.StringVar(&f.SysfsRoot, "sysfs-root", d.SysfsRoot, "root of sysfs")
	fl.StringVar(&f.DevRoot, "dev-root", d.DevRoot, "root of /dev")
	addVMFlags(fl, &f, d)
	fl.StringVar(&f.Simulate, "simulate", "", "run on simulated hardware: a profile name or file")
	fl.StringVar(&f.IdleDriver, "idle-driver", d.IdleDriver, "driver of free GPUs: vfio-pci, nvidia or none")
	fl.StringSliceVar(&f.AllowDevices, "allow-devices", d.AllowDevices, "vendor:device IDs gpuherd may bind")
	fl.StringSliceVar(&f.GPUDevices, "gpu-devices", nil, "extra vendor:device IDs counted as GPUs (tests on emulated hardware only)")
	f.BindTimeout = d.BindTimeout
	fl.Var(&f.BindTimeout, "bind-timeout", "deadline of every sysfs write")
	f.ReservationLease = d.ReservationLease
	fl.Var(&f.ReservationLease, "reservation-lease", "how long a reservation lives unless committed")
	f.DirectorySettle = d.DirectorySettle
	fl.Var(&f.DirectorySettle, "directory-settle", "steady membership a claim ID's home needs before it vouches that the ID is held nowhere")
	fl.IntVar(&f.MaxGPUsPerClaim, "max-gpus-per-claim", d.MaxGPUsPerClaim, "most GPUs in one request")
	fl.StringVar(&f.NVML, "nvml", d.NVML, "auto or off")
	fl.StringVar(&f.LogLevel, "log-level", d.LogLevel, "debug, info, warn or error")
	fl.StringVar(&f.LogFormat, "log-format", d.LogFormat, "text or json")
	fl.StringVar(&f.MetricsAddr, "metrics-addr", d.MetricsAddr, "HOST:PORT of /metrics, /healthz, /readyz (\"\" off)")
	fl.StringVar(&f.MetricsWebConfig, "web.config.file", "", "exporter-toolkit web configuration (TLS, basic auth) of the metrics listener, as node_exporter's")
	fl.StringSliceVar(&f.OfferedModels, "offered-models", d.OfferedModels, "models the platform offers (listed even when none is free)")
	fl.StringSliceVar(&f.DenyDevices, "deny-devices", nil, "PCI addresses gpuherd never manages")
	fl.StringVar(&f.FabricMode, "fabric-mode", d.FabricMode, "NVSwitch fabric: auto, none, shared-nvswitch or full-passthrough")
	fl.StringVar(&f.GossipAddr, "gossip-addr", "", "HOST:PORT gossip listens on (\"\": run alone)")
	fl.StringVar(&f.AdvertiseAddr, "advertise-addr", "", "IP other servers reach this one at (default: found with netlink)")
	fl.StringVar(&f.AdvertiseInterface, "advertise-interface", "", "interface to take the advertise address from (default: the default route's)")
	fl.StringSliceVar(&f.Join, "join", nil, "gossip seeds: HOST[:PORT] of other servers")
	fl.StringVar(&f.GossipKeyFile, "gossip-key-file", "", "gossip keys, one base64 key per line, first is primary")
	fl.BoolVar(&f.InsecureGossip, "insecure-gossip", false, "run gossip unencrypted (labs only)")
	fl.StringVar(&f.PeerAddr, "peer-addr", "", "HOST:PORT of the mutual-TLS API for coordinators and remote clients")
	fl.StringVar(&f.TLSCA, "tls-ca", "", "CA certificate that signs every agent")
	fl.StringVar(&f.TLSCert, "tls-cert", "", "this agent's certificate")
	fl.StringVar(&f.TLSKey, "tls-key", "", "this agent's key")
	addNamesFlags(fl, &f, d)
	// The agent's --socket is its own flag; the client's persistent one is hidden here.
	return cmd
}

// applyAgentFlags copies the flags the user set over cfg: a flag left at its
// default never overrides the config file.
func applyAgentFlags(fl *pflag.FlagSet, f *agent.Config, cfg *agent.Config) {
	set := map[string]func(){
		"node-name":           func() { cfg.NodeName = f.NodeName },
		"data-dir":            func() { cfg.DataDir = f.DataDir },
		"socket":              func() { cfg.Socket = f.Socket },
		"socket-group":        func() { cfg.SocketGroup = f.SocketGroup },
		"sysfs-root":          func() { cfg.SysfsRoot = f.SysfsRoot },
		"dev-root":            func() { cfg.DevRoot = f.DevRoot },
		"simulate":            func() { cfg.Simulate = f.Simulate },
		"idle-driver":         func() { cfg.IdleDriver = f.IdleDriver },
		"allow-devices":       func() { cfg.AllowDevices = f.AllowDevices },
		"gpu-devices":         func() { cfg.GPUDevices = f.GPUDevices },
		"bind-timeout":        func() { cfg.BindTimeout = f.BindTimeout },
		"reservation-lease":   func() { cfg.ReservationLease = f.ReservationLease },
		"directory-settle":    func() { cfg.DirectorySettle = f.DirectorySettle },
		"max-gpus-per-claim":  func() { cfg.MaxGPUsPerClaim = f.MaxGPUsPerClaim },
		"nvml":                func() { cfg.NVML = f.NVML },
		"log-level":           func() { cfg.LogLevel = f.LogLevel },
		"log-format":          func() { cfg.LogFormat = f.LogFormat },
		"metrics-addr":        func() { cfg.MetricsAddr = f.MetricsAddr },
		"offered-models":      func() { cfg.OfferedModels = f.OfferedModels },
		"web.config.file":     func() { cfg.MetricsWebConfig = f.MetricsWebConfig },
		"deny-devices":        func() { cfg.DenyDevices = f.DenyDevices },
		"fabric-mode":         func() { cfg.FabricMode = f.FabricMode },
		"gossip-addr":         func() { cfg.GossipAddr = f.GossipAddr },
		"advertise-addr":      func() { cfg.AdvertiseAddr = f.AdvertiseAddr },
		"advertise-interface": func() { cfg.AdvertiseInterface = f.AdvertiseInterface },
		"join":                func() { cfg.Join = f.Join },
		"gossip-key-file":     func() { cfg.GossipKeyFile = f.GossipKeyFile },
		"insecure-gossip":     func() { cfg.InsecureGossip = f.InsecureGossip },
		"peer-addr":           func() { cfg.PeerAddr = f.PeerAddr },
		"tls-ca":              func() { cfg.TLSCA = f.TLSCA },
		"tls-cert":            func() { cfg.TLSCert = f.TLSCert },
		"tls-key":             func() { cfg.TLSKey = f.TLSKey },
	}
	maps.Copy(set, vmFlagSetters(f, cfg))
	maps.Copy(set, namesFlagSetters(f, cfg))
	fl.Visit(func(p *pflag.Flag) {
		if apply, ok := set[p.Name]; ok {
			apply()
		}
	})
}

// runAgent runs the daemon under systemd's eyes: STATUS lines while it
// starts and whenever capacity changes, READY=1 once inventory, ledger and
// gossip are up, watchdog pings while the agent is healthy, RELOADING=1 and
// a reload on SIGHUP, STOPPING=1 and a graceful gossip leave on SIGTERM.
func runAgent(ctx context.Context, g *globals, cfg agent.Config, configPath string, flags func(*agent.Config) error, opts ...agent.Option) error {
	maskOthers()
	level := new(slog.LevelVar)
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := cli.NewLogger(g.stderr, cfg, level)
	notify := systemd.New(log)
	notify.Status("discovering GPUs and reconciling them with the ledger")

	var a *agent.Agent
	status := func() {
		if a != nil {
			notify.Status("%s", a.StatusLine())
		}
	}
	a, err := agent.New(ctx, cfg, log, append(opts, agent.WithOnChange(status))...)
	if err != nil {
		notify.Status("failed: %v", err)
		return err
	}
	defer a.Close()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go notify.RunWatchdog(runCtx, a.Healthy)
	// STOPPING=1 goes out before the process ends: the main path waits for
	// it after Run returns on a stop (else an exit could beat it).
	stopping := make(chan struct{})
	go func() {
		defer close(stopping)
		<-runCtx.Done()
		if ctx.Err() == nil {
			return // Run ended on its own (an error): no stop to announce
		}
		log.Info("gpuherd agent stopping: finishing requests in progress, leaving gossip if clustered", "node", cfg.NodeName)
		notify.Stopping()
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-runCtx.Done():
				return
			case <-hup:
				notify.Reloading()
				reload(log, level, a, configPath, flags)
				_ = notify.Ready()
				status()
			}
		}
	}()
	err = a.Run(runCtx, func() {
		if err := notify.Ready(); err != nil {
			log.Warn("systemd: READY=1 not sent", "err", err)
		}
		status()
	})
	if ctx.Err() != nil {
		<-stopping
	}
	if err != nil {
		log.Error("gpuherd agent stopped on an error", "node", cfg.NodeName, "err", err)
		return err
	}
	log.Info("gpuherd agent stopped: API closed; claims stay in the ledger", "node", cfg.NodeName)
	return nil
}

// reload re-reads what can change without a restart: the log level, the
// gossip keys (key rotation), allow_devices and allow_unsafe_interrupts.
// Anything else needs a restart, and says so.
func reload(log *slog.Logger, level *slog.LevelVar, a *agent.Agent, configPath string, flags func(*agent.Config) error) {
	cfg, err := cli.LoadConfig(configPath)
	if err != nil {
		log.Error("reload: config not applied", "err", err)
		return
	}
	_ = flags(&cfg)
	if err := cfg.Validate(); err != nil {
		log.Error("reload: config not applied", "err", err)
		return
	}
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err == nil {
		log.Info("reload: log level", "level", level.Level().String())
	}
	if err := a.ReloadGossipKeys(cfg.GossipKeyFile); err != nil {
		log.Error("reload: gossip keys not applied", "err", err)
	}
	// allow_devices and allow_unsafe_interrupts decide which GPUs can be
	// passed through: every IOMMU group is read again under them.
	if allow, err := vfio.ParseAllowList(cfg.AllowDevices); err == nil {
		log.Info("reload: allow_devices and allow_unsafe_interrupts; re-reading every IOMMU group",
			"allow_devices", allow.String(), "allow_unsafe_interrupts", cfg.AllowUnsafeInterrupts)
		a.ReloadReadiness(context.Background(), allow, cfg.AllowUnsafeInterrupts)
	}
}

// offsetClock is the wall clock moved by the duration written in path (none
// when the file is missing or empty): a clock step, for fault runs.
func offsetClock(path string) func() time.Time {
	return func() time.Time {
		data, err := os.ReadFile(path)
		if err != nil {
			return time.Now()
		}
		d, err := time.ParseDuration(strings.TrimSpace(string(data)))
		if err != nil {
			return time.Now()
		}
		return time.Now().Add(d)
	}
}

// maskOthers adds other users' bits to the process umask before the agent
// starts anything: what it creates (its API socket before the socket is
// made 0660, its state files) is never open to other users, whatever
// umask it was started with. The systemd unit sets UMask=0077 already.
func maskOthers() {
	syscall.Umask(syscall.Umask(0o077) | 0o007)
}
