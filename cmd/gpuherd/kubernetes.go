package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra"
	"github.com/gpuherd/gpuherd/agent/dra/manifest"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
	"github.com/gpuherd/gpuherd/systemd"
)

// The Kubernetes side of gpuherd (docs/kubevirt.md): the DRA kubelet
// plugin, the DeviceClasses it needs, and a claim's manifests for a
// KubeVirt VM.

// outKubeVirt is get's and claim's output for a KubeVirt VM claimed first.
const outKubeVirt = "kubevirt"

func newKubeletPluginCmd(g *globals) *cobra.Command {
	var (
		configPath string
		k          agent.KubernetesConfig
		nodeName   string
		socket     string
		metrics    string
	)
	cmd := &cobra.Command{
		Use:   "kubelet-plugin",
		Short: "Run the Kubernetes DRA driver of this server (a kubelet plugin)",
		Long: `Run gpuherd's Dynamic Resource Allocation driver on a hypervisor that is a
Kubernetes node: publish this server's GPUs as a ResourceSlice from the agent's
ledger, and turn each ResourceClaim the kubelet prepares into a gpuherd claim
of exactly the allocated GPUs, bound to vfio-pci and handed to the pod as CDI
devices with their device metadata (what KubeVirt's virt-launcher reads).

It talks to the local agent through --socket, as every other command does, and
to the API server with the kubernetes.kubeconfig of --config. Settings come
from the defaults, then --config (the agent's file, its kubernetes: section
and node_name, socket, dev_root), then flags. See docs/kubevirt.md.`,
		Args: cli.ExactArgs(0, "no arguments"),
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
				cfg.Socket = g.socket
			}
			set("agent-socket", &cfg.Socket, socket)
			return runKubeletPlugin(cmd.Context(), g, cfg, metrics)
		},
	}
	fl := cmd.Flags()
	d := agent.DefaultConfig()
	fl.StringVar(&configPath, "config", "", "the agent's YAML configuration file (its kubernetes: section)")
	fl.StringVar(&k.Kubeconfig, "kubeconfig", d.Kubernetes.Kubeconfig, "kubeconfig of this node's credentials")
	fl.StringVar(&k.NodeName, "kubernetes-node-name", "", "this server's Kubernetes node (default: node_name)")
	fl.StringVar(&nodeName, "node-name", d.NodeName, "this server's gpuherd name (node_name)")
	fl.StringVar(&k.DriverName, "driver-name", d.Kubernetes.DriverName, "DRA driver name and attribute domain")
	fl.StringVar(&k.PluginDir, "plugin-dir", "", "the plugin's directory (default /var/lib/kubelet/plugins/DRIVER)")
	fl.StringVar(&k.RegistrarDir, "registrar-dir", d.Kubernetes.RegistrarDir, "the kubelet's plugin registration directory")
	fl.StringVar(&k.CDIDir, "cdi-dir", d.Kubernetes.CDIDir, "where the container runtime reads CDI specs")
	fl.StringVar(&socket, "agent-socket", "", "the agent's unix socket (default: the config's socket, or --socket)")
	fl.StringVar(&metrics, "metrics-addr", "", "HOST:PORT to serve the plugin's /metrics on (\"\" off)")
	return cmd
}

func runKubeletPlugin(ctx context.Context, g *globals, cfg agent.Config, metricsAddr string) error {
	log := cli.NewLogger(g.stderr, cfg, slog.LevelInfo)
	k := cfg.Kubernetes
	node := k.NodeName
	if node == "" {
		node = cfg.NodeName
	}
	rest, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	if err != nil {
		return fmt.Errorf("config: kubernetes.kubeconfig: %s: %w", k.Kubeconfig, err)
	}
	rest.UserAgent = "gpuherd-kubelet-plugin/" + agent.Version
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

func newKubernetesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubernetes",
		Short: "Manifests for Kubernetes: the DRA DeviceClasses",
	}
	var driver string
	classes := &cobra.Command{
		Use:   "deviceclasses",
		Short: "Print the DeviceClasses of gpuherd's DRA driver (kubectl apply -f -)",
		Long: `Print one DeviceClass for any free GPU (named as the driver), one per model of
the catalog and of --config's models (free GPUs of that model), and
claimed.DRIVER for the ResourceClaims of GPUs claimed first
(gpuherd get ID -o kubevirt). The generic classes never select a GPU that a
gpuherd claim holds.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var models []string
			for _, m := range inventory.DefaultCatalog().Models() {
				models = append(models, m.Name)
			}
			out, err := manifest.DeviceClassesYAML(driver, models)
			if err != nil {
				return err
			}
			_, err = g.stdout.Write(out)
			return err
		},
	}
	classes.Flags().StringVar(&driver, "driver-name", manifest.DefaultDriverName, "DRA driver name")
	cmd.AddCommand(classes)
	return cmd
}

// kubevirtFlags are claim's and get's options for -o kubevirt.
type kubevirtFlags struct {
	namespace string
	name      string
	driver    string
}

func (k *kubevirtFlags) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.namespace, "namespace", "default", "-o kubevirt: the VM's namespace")
	cmd.Flags().StringVar(&k.name, "claim-name", "", "-o kubevirt: the ResourceClaim's name (default: the claim ID)")
	cmd.Flags().StringVar(&k.driver, "driver-name", manifest.DefaultDriverName, "-o kubevirt: DRA driver name")
}

func (k kubevirtFlags) render(c api.Claim) ([]byte, error) {
	return manifest.KubeVirtManifests(c, manifest.Options{Driver: k.driver, Namespace: k.namespace, Name: k.name})
}
