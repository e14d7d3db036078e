// Command gpuherd-kubevirt-demo shows gpuherd as the DRA driver of a
// KubeVirt platform without a cluster: an in-process kube-apiserver,
// kube-scheduler and resourceclaim controller, two simulated hypervisors
// with their agents and kubelet plugins, and the kubelet played over the
// plugins' real sockets. It prints a KubeVirt-shaped VM's claim,
// allocation, prepare, metadata file and release, then stops everything
// (`make demo-kubevirt`; docs/kubevirt.md).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra/manifest"
	"github.com/gpuherd/gpuherd/tools/kube/controlplane"
	"github.com/gpuherd/gpuherd/tools/kube/fakekubelet"
	"github.com/gpuherd/gpuherd/tools/kube/platform"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

func main() {
	verbose := flag.Bool("verbose", false, "show the control plane's and the agents' logs")
	flag.Parse()
	logs := io.Discard
	if *verbose {
		logs = os.Stderr
	} else {
		// kube-apiserver logs through klog's global logger.
		klog.SetOutput(io.Discard)
		klog.LogToStderr(false)
	}
	start := time.Now()
	err := controlplane.NewStandalone("kubevirt-demo", logs).Run(func(tb controlplane.TB) {
		demo(tb, slog.New(slog.NewTextHandler(logs, nil)))
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuherd-kubevirt-demo:", err)
		os.Exit(1)
	}
	step("everything stopped (%.1f s in all)", time.Since(start).Seconds())
}

func step(format string, args ...any) { fmt.Printf("\n== "+format+"\n", args...) }

func indent(s string) string {
	return "   " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n   ") + "\n"
}

func demo(tb controlplane.TB, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := func(err error) {
		if err != nil {
			tb.Fatal(err)
		}
	}
	t0 := time.Now()
	cp := controlplane.Start(tb, controlplane.Options{})
	step("control plane up in %.1f s: kube-apiserver, kube-scheduler, resourceclaim controller (Kubernetes 1.37, in this process)", time.Since(t0).Seconds())
	must(cp.CreateNamespace(ctx, "vms"))
	must(platform.ApplyDeviceClasses(ctx, cp))
	list, err := cp.Client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	must(err)
	fmt.Printf("   gpuherd kubernetes deviceclasses | kubectl apply -f -   (%d DeviceClasses, e.g. h100-80gb.gpu.gpuherd.io, claimed.gpu.gpuherd.io)\n", len(list.Items))

	hv1 := platform.StartServer(tb, cp, "hv-1", "dgx-h100", log)
	hv2 := platform.StartServer(tb, cp, "hv-2", "dgx-h100", log)
	for _, s := range []*platform.Server{hv1, hv2} {
		devs, err := platform.WaitSlice(ctx, cp, s.Name, func(d []resourceapi.Device) bool { return len(d) == 8 })
		must(err)
		fmt.Printf("   node %s: gpuherd agent on a simulated DGX H100, kubelet plugin registered, ResourceSlice of %d GPUs (%s, …)\n", s.Name, len(devs), devs[0].Name)
	}

	step("a libvirt VM on hv-1 takes 6 GPUs; they leave hv-1's slice")
	_, err = hv1.Client.Claim(ctx, "libvirt-db", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 6}}})
	must(err)
	devs, err := platform.WaitSlice(ctx, cp, "hv-1", func(d []resourceapi.Device) bool { return len(d) == 2 })
	must(err)
	fmt.Printf("   hv-1 now offers %d GPUs to Kubernetes\n", len(devs))

	step("the platform claims first: gpuherd claim vm-1 --gpu \"H100 80GB:4\" --kubernetes")
	_, err = hv1.Client.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 4}}, Labels: map[string]string{api.LabelKubernetes: "true"}})
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code == api.CodeNotAvailable {
		fmt.Printf("   through hv-1's agent, which runs alone here: %s (exit 3; clustered agents would place it on any server)\n", ae.Message)
	}
	c, err := hv2.Client.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 4}}, Labels: map[string]string{api.LabelKubernetes: "true"}})
	must(err)
	var addrs []string
	for _, g := range c.GPUs {
		addrs = append(addrs, g.PCIAddress)
	}
	fmt.Printf("   through hv-2's agent: claim vm-1 on %s: %s\n", c.Node, strings.Join(addrs, ", "))

	step("gpuherd get vm-1 -o kubevirt --namespace vms | kubectl apply -f -")
	out, err := manifest.KubeVirtManifests(c, manifest.Options{Namespace: "vms"})
	must(err)
	fmt.Print(indent(string(out)))
	rc, err := platform.PinnedClaim(c, manifest.Options{Namespace: "vms"})
	must(err)
	_, err = platform.WaitSlice(ctx, cp, "hv-2", func(d []resourceapi.Device) bool { cl, _ := platform.Has(d, addrs[0]); return cl == "vm-1" })
	must(err)
	_, err = cp.Client.ResourceV1().ResourceClaims("vms").Create(ctx, rc, metav1.CreateOptions{})
	must(err)

	step("KubeVirt starts the VM: its virt-launcher pod (4 GPUs, one request each) is scheduled")
	var reqs []string
	for i := range c.GPUs {
		reqs = append(reqs, manifest.RequestName(i))
	}
	pod := controlplane.LauncherPod("vms", "virt-launcher-vm-1", controlplane.PodClaim{Name: "gpus", ResourceClaimName: rc.Name, Requests: reqs})
	_, err = cp.Client.CoreV1().Pods("vms").Create(ctx, pod, metav1.CreateOptions{})
	must(err)
	s, err := cp.WaitScheduled(ctx, pod)
	must(err)
	for _, r := range s.Claims[0].Status.Allocation.Devices.Results {
		fmt.Printf("   %s -> %s/%s/%s\n", r.Request, r.Driver, r.Pool, r.Device)
	}
	fmt.Printf("   pod %s on node %s: gpuherd's server, gpuherd's GPUs\n", s.Pod.Name, s.NodeName)

	step("the kubelet on %s prepares the pod's claim (NodePrepareResources over the plugin's socket)", s.NodeName)
	res, err := hv2.Kubelet.Prepare(ctx, s.Claims[0])
	must(err)
	p := res[s.Claims[0].UID]
	if p.Err != "" {
		tb.Fatal(p.Err)
	}
	for _, d := range p.Devices {
		fmt.Printf("   %s %s: CDI %s\n", d.RequestNames[0], d.DeviceName, strings.Join(d.CDIDeviceIDs, " "))
	}
	view, err := fakekubelet.ApplyCDI(hv2.CDIDir, p.CDIDeviceIDs())
	must(err)
	var nodes []string
	for _, n := range view.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	fmt.Printf("   the launcher's container gets %s\n", strings.Join(nodes, " "))
	files, err := view.Glob("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/" + rc.Name + "/gpu0/*-metadata.json")
	must(err)
	if len(files) != 1 {
		tb.Fatalf("metadata files: %v", files)
	}
	host, _ := view.HostPathFor(files[0])
	data, err := os.ReadFile(host)
	must(err)
	fmt.Printf("   %s, as virt-launcher reads it (its metadata.resource.k8s.io/v1alpha1 object):\n", files[0])
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			tb.Fatalf("%s: no v1alpha1 object: %v", host, err)
		}
		if doc["apiVersion"] != "metadata.resource.k8s.io/v1alpha1" {
			continue
		}
		pretty, err := json.MarshalIndent(doc, "", "  ")
		must(err)
		fmt.Print(indent(string(pretty)))
		break
	}
	held, err := hv2.Client.Get(ctx, "vm-1")
	must(err)
	fmt.Printf("   gpuherd get vm-1: %s on %s, in use by %s\n", held.State, held.Node, held.Domain.Name)

	step("the VM stops: the kubelet unprepares; the platform releases the claim")
	errs, err := hv2.Kubelet.Unprepare(ctx, s.Claims[0])
	must(err)
	if e := errs[s.Claims[0].UID]; e != "" {
		tb.Fatal(e)
	}
	must(cp.DeletePod(ctx, s.Pod))
	_, err = hv2.Client.Release(ctx, "vm-1")
	must(err)
	_, err = platform.WaitSlice(ctx, cp, "hv-2", func(d []resourceapi.Device) bool { cl, ok := platform.Has(d, addrs[0]); return ok && cl == "" })
	must(err)
	fmt.Printf("   %s is free again in hv-2's slice\n", addrs[0])
	if _, err := os.Stat(filepath.Join(hv2.CDIDir)); err == nil {
		left, _ := filepath.Glob(filepath.Join(hv2.CDIDir, "*"))
		fmt.Printf("   CDI specs left on hv-2: %d\n", len(left))
	}
}
