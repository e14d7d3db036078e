package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra/manifest"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

// The Kubernetes side of gpuherd (docs/kubevirt.md): the DeviceClasses of
// the DRA driver and a claim's manifests for a KubeVirt VM. The driver
// itself, the kubelet plugin, is the binary gpuherd-kubelet-plugin: this
// one links no Kubernetes package (deps_test.go), for their package
// initialisation alone would cost every agent tens of MiB of memory.

// outKubeVirt is get's and claim's output for a KubeVirt VM claimed first.
const outKubeVirt = "kubevirt"

// pluginBinary is the kubelet plugin's binary, installed next to gpuherd.
const pluginBinary = "gpuherd-kubelet-plugin"

// newKubeletPluginCmd is `gpuherd kubelet-plugin`, from the time the
// plugin was a command of this binary: it runs gpuherd-kubelet-plugin from
// this binary's directory with the same arguments, in this process
// (execve), so a unit or script that still runs `gpuherd kubelet-plugin`
// keeps its main PID and its notifications. Hidden: the plugin's own
// binary documents its flags (gpuherd-kubelet-plugin(1)).
func newKubeletPluginCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "kubelet-plugin [flags]",
		Short:              "Run " + pluginBinary + ", the Kubernetes DRA driver, with these arguments",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("kubelet-plugin: finding %s next to gpuherd: %w", pluginBinary, err)
			}
			return execPlugin(filepath.Join(filepath.Dir(self), pluginBinary), args)
		},
	}
}

// execPlugin replaces this process with the plugin at path, given args
// (the command line after `kubelet-plugin`, gpuherd's global flags
// included, which the plugin takes too), or says why it cannot.
func execPlugin(path string, args []string) error {
	err := syscall.Exec(path, append([]string{path}, args...), os.Environ())
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kubelet-plugin: the DRA driver is the binary %s, which is not installed next to gpuherd (no %s); install it there, or run it directly", pluginBinary, path)
	}
	return fmt.Errorf("kubelet-plugin: running %s: %w", path, err)
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
