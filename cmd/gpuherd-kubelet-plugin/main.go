// Command gpuherd-kubelet-plugin is gpuherd's Kubernetes DRA driver, a
// kubelet plugin on every hypervisor that is a Kubernetes node
// (docs/kubevirt.md). It talks to the local gpuherd agent through its
// socket (agent/api) and to the API server with client-go.
//
// It is a binary of its own, not a command of gpuherd, so that the agent
// does not link Kubernetes' client: Go runs the initialisation of every
// package a binary links, and client-go's and its API types' cost every
// agent tens of MiB of resident memory (docs/design.md). `gpuherd
// kubelet-plugin` still works: it runs this binary.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
	"github.com/gpuherd/gpuherd/systemd"
)

const name = "gpuherd-kubelet-plugin"

// Exit codes, as gpuherd's.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() { cli.Main(run) }

// run executes one command line and returns its exit code: 2 for a bad
// command line, 1 for any other failure, said in one line on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr, runPlugin)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, name+": "+err.Error())
	if ue := (*cli.UsageError)(nil); errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

// startFunc runs the plugin with its settings until ctx ends.
type startFunc func(ctx context.Context, stderr io.Writer, cfg agent.Config, metricsAddr string) error

// newRoot is the command line: its settings go to start.
func newRoot(stdout, stderr io.Writer, start startFunc) *cobra.Command {
	var (
		configPath string
		k          agent.KubernetesConfig
		nodeName   string
		socket     string
		agentSock  string
		metrics    string
	)
	root := &cobra.Command{
		Use:   name,
		Short: "Run the Kubernetes DRA driver of this server (a kubelet plugin)",
		Long: `Run gpuherd's Dynamic Resource Allocation driver on a hypervisor that is a
Kubernetes node: publish this server's GPUs as a ResourceSlice from the agent's
ledger, and turn each ResourceClaim the kubelet prepares into a gpuherd claim
of exactly the allocated GPUs, bound to vfio-pci and handed to the pod as CDI
devices with their device metadata (what KubeVirt's virt-launcher reads).

It talks to the local agent through --socket, as every gpuherd command does,
and to the API server with the kubernetes.kubeconfig of --config. Settings come
from the defaults, then --config (the agent's file, its kubernetes: section
and node_name, socket, dev_root), then flags. See docs/kubevirt.md.

Exit codes: 0 ok; 1 error; 2 usage (bad input, nothing changed).`,
		Version:       agent.Version,
		Args:          cli.ExactArgs(0, "no arguments"),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cli.LoadConfig(configPath)
			if err != nil {
				return err
			}
			fl := cmd.Flags()
			set := func(name string, dst *string, v string) {
				if fl.Changed(name) {
					*dst = v
				}
			}
			set("kubeconfig", &cfg.Kubernetes.Kubeconfig, k.Kubeconfig)
			set("kubernetes-node-name", &cfg.Kubernetes.NodeName, k.NodeName)
			set("driver-name", &cfg.Kubernetes.DriverName, k.DriverName)
			set("plugin-dir", &cfg.Kubernetes.PluginDir, k.PluginDir)
			set("registrar-dir", &cfg.Kubernetes.RegistrarDir, k.RegistrarDir)
			set("cdi-dir", &cfg.Kubernetes.CDIDir, k.CDIDir)
			set("node-name", &cfg.NodeName, nodeName)
			if cli.SocketGiven(cmd) {
				cfg.Socket = socket
			}
			set("agent-socket", &cfg.Socket, agentSock)
			return start(cmd.Context(), stderr, cfg, metrics)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return cli.Usagef("%v", err) })
	// Its one command is the hidden man (packaging.mk): no completion.
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(cli.NewManCmd())

	fl := root.Flags()
	d := agent.DefaultConfig()
	cli.SocketFlag(fl, &socket)
	fl.StringVar(&configPath, "config", "", "the agent's YAML configuration file (its kubernetes: section)")
	fl.StringVar(&k.Kubeconfig, "kubeconfig", d.Kubernetes.Kubeconfig, "kubeconfig of this node's credentials")
	fl.StringVar(&k.NodeName, "kubernetes-node-name", "", "this server's Kubernetes node (default: node_name)")
	fl.StringVar(&nodeName, "node-name", d.NodeName, "this server's gpuherd name (node_name)")
	fl.StringVar(&k.DriverName, "driver-name", d.Kubernetes.DriverName, "DRA driver name and attribute domain")
	fl.StringVar(&k.PluginDir, "plugin-dir", "", "the plugin's directory (default /var/lib/kubelet/plugins/DRIVER)")
	fl.StringVar(&k.RegistrarDir, "registrar-dir", d.Kubernetes.RegistrarDir, "the kubelet's plugin registration directory")
	fl.StringVar(&k.CDIDir, "cdi-dir", d.Kubernetes.CDIDir, "where the container runtime reads CDI specs")
	fl.StringVar(&agentSock, "agent-socket", "", "the agent's unix socket (default: the config's socket, or --socket)")
	fl.StringVar(&metrics, "metrics-addr", "", "HOST:PORT to serve the plugin's /metrics on (\"\" off)")
	return root
}

func runPlugin(ctx context.Context, stderr io.Writer, cfg agent.Config, metricsAddr string) error {
	log := cli.NewLogger(stderr, cfg, slog.LevelInfo)
	k := cfg.Kubernetes
	node := k.NodeName
	if node == "" {
		node = cfg.NodeName
	}
	rest, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	if err != nil {
		return fmt.Errorf("config: kubernetes.kubeconfig: %s: %w", k.Kubeconfig, err)
	}
	rest.UserAgent = name + "/" + agent.Version
	kube, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return fmt.Errorf("config: kubernetes.kubeconfig: %w", err)
	}
	client := api.NewClient(cfg.Socket)
	defer client.Close()
	rec := newDRAMetrics()
	if metricsAddr != "" {
		if err := rec.serve(ctx, metricsAddr, log); err != nil {
			return fmt.Errorf("--metrics-addr %s: %w", metricsAddr, err)
		}
	}
	notify := systemd.New(log)
	d, err := dra.Start(ctx, dra.Config{
		DriverName: k.DriverName, NodeName: node, KubeClient: kube, Agent: client,
		PluginDataDir: k.PluginDir, RegistrarDir: k.RegistrarDir, CDIDir: k.CDIDir,
		DevRoot: cfg.DevRoot, Log: log, Recorder: rec,
	})
	if err != nil {
		return err
	}
	defer d.Stop()
	select {
	case <-d.Synced():
		_ = notify.Ready()
		notify.Status("publishing the GPUs of %s as node %s's ResourceSlice (driver %s)", cfg.NodeName, node, k.DriverName)
	case <-ctx.Done():
		return nil
	}
	<-ctx.Done()
	notify.Stopping()
	log.Info("kubelet plugin stopping; prepared claims stay in the ledger")
	return nil
}
