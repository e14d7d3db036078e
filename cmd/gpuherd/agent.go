package main

import (
	"io"
	"log/slog"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpuherd/gpuherd/agent"
)

func newAgentCmd(g *globals) *cobra.Command {
	var (
		configPath string
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
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := agent.DefaultConfig()
			if configPath != "" {
				if err := agent.LoadConfigFile(configPath, &cfg); err != nil {
					return err
				}
			}
			applyAgentFlags(cmd.Flags(), &f, &cfg)
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := newLogger(g.stderr, cfg)
			a, err := agent.New(cmd.Context(), cfg, log)
			if err != nil {
				return err
			}
			defer a.Close()
			return a.Run(cmd.Context(), nil)
		},
	}
	fl := cmd.Flags()
	d := agent.DefaultConfig()
	fl.StringVar(&configPath, "config", "", "YAML configuration file")
	fl.StringVar(&f.NodeName, "node-name", d.NodeName, "this server's name")
	fl.StringVar(&f.DataDir, "data-dir", d.DataDir, "directory of the ledger (and the simulated machine)")
	fl.StringVar(&f.Socket, "socket", d.Socket, "unix socket of the local API")
	fl.StringVar(&f.SocketGroup, "socket-group", "", "group allowed to use the socket (mode 0660)")
	fl.StringVar(&f.SysfsRoot, "sysfs-root", d.SysfsRoot, "root of sysfs")
	fl.StringVar(&f.DevRoot, "dev-root", d.DevRoot, "root of /dev")
	fl.StringVar(&f.Simulate, "simulate", "", "run on simulated hardware: a profile name or file")
	fl.StringVar(&f.IdleDriver, "idle-driver", d.IdleDriver, "driver of free GPUs: vfio-pci, nvidia or none")
	fl.StringSliceVar(&f.AllowDevices, "allow-devices", d.AllowDevices, "vendor:device IDs gpuherd may bind")
	f.BindTimeout = d.BindTimeout
	fl.Var(&f.BindTimeout, "bind-timeout", "deadline of every sysfs write")
	f.ReservationLease = d.ReservationLease
	fl.Var(&f.ReservationLease, "reservation-lease", "how long a reservation lives unless committed")
	fl.IntVar(&f.MaxGPUsPerClaim, "max-gpus-per-claim", d.MaxGPUsPerClaim, "most GPUs in one request")
	fl.StringVar(&f.NVML, "nvml", d.NVML, "auto or off")
	fl.StringVar(&f.LogLevel, "log-level", d.LogLevel, "debug, info, warn or error")
	fl.StringVar(&f.LogFormat, "log-format", d.LogFormat, "text or json")
	fl.StringVar(&f.MetricsAddr, "metrics-addr", d.MetricsAddr, "HOST:PORT of /metrics, /healthz, /readyz (\"\" off)")
	fl.StringSliceVar(&f.OfferedModels, "offered-models", d.OfferedModels, "models the platform offers (listed even when none is free)")
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
		"bind-timeout":        func() { cfg.BindTimeout = f.BindTimeout },
		"reservation-lease":   func() { cfg.ReservationLease = f.ReservationLease },
		"max-gpus-per-claim":  func() { cfg.MaxGPUsPerClaim = f.MaxGPUsPerClaim },
		"nvml":                func() { cfg.NVML = f.NVML },
		"log-level":           func() { cfg.LogLevel = f.LogLevel },
		"log-format":          func() { cfg.LogFormat = f.LogFormat },
		"metrics-addr":        func() { cfg.MetricsAddr = f.MetricsAddr },
		"offered-models":      func() { cfg.OfferedModels = f.OfferedModels },
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
	fl.Visit(func(p *pflag.Flag) {
		if apply, ok := set[p.Name]; ok {
			apply()
		}
	})
}

func newLogger(w io.Writer, cfg agent.Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
