package controlplane_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"go.uber.org/goleak"

	"github.com/gpuherd/gpuherd/tools/kube/controlplane"
)

// processWideGoroutines are started once per process by packages the
// control plane uses, not per Start, and live as long as the process; they
// are not leaks of a control plane.
var processWideGoroutines = []goleak.Option{
	// healthz.LogHealthz, a package variable, starts its klog flusher on
	// the first /healthz check in the process.
	goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.Forever"),
}

// checkGoroutines fails t if goroutines other than those in opts are left.
// The apiserver's watch cache leaves timer goroutines that end within 3s
// (cacher blockTimeout) of the request that made them; there is no event to
// await for them, so this retries for a while before reporting.
func checkGoroutines(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find(opts...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines left after Stop: %v", err)
			return
		}
	}
}

const (
	driver = "gpu.gpuherd.io"
	class  = "gpu.gpuherd.io"
	ns     = "default"
)

// gpu is a hand-made slice device: what gpuherd's plugin would publish for
// one passthrough GPU on node.
func gpu(name, node, pciBusID string) resourceapi.Device {
	return controlplane.Device(name, map[string]any{
		"resource.kubernetes.io/pciBusID": pciBusID,
		"model":                           "NVIDIA H100 80GB",
		"node":                            node,
	})
}

// created returns a function that fails t when the create call whose
// results it is given failed: created(t)(client.Create(...)).
func created(t *testing.T) func(obj any, err error) {
	return func(obj any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
}

// allocatedDevices lists "pool/device" for every result of claim.
func allocatedDevices(claim *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		out = append(out, r.Pool+"/"+r.Device)
	}
	return out
}

// TestControlPlane reproduces, against the real v1.37.2 apiserver,
// scheduler and ResourceClaim controller, the DRA facts gpuherd's plugin
// relies on.
func TestControlPlane(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	before := goleak.IgnoreCurrent()
	cp := controlplane.Start(t, controlplane.Options{})
	t.Logf("startup: %v", cp.StartupTime())
	c := cp.Client

	for _, n := range []string{"n1", "n2"} {
		if _, err := cp.AddNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	dc := controlplane.DeviceClass(class, `device.driver == "`+driver+`"`)
	created(t)(c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}))
	slices := []*resourceapi.ResourceSlice{
		controlplane.NodeSlice(driver, "n1", gpu("gpu-0", "n1", "0000:18:00.0"), gpu("gpu-1", "n1", "0000:2a:00.0")),
		controlplane.NodeSlice(driver, "n2", gpu("gpu-0", "n2", "0000:5d:00.0"), gpu("gpu-1", "n2", "0000:9a:00.0")),
	}
	for _, s := range slices {
		created(t)(c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}))
	}

	// (1) One claim (from a template, as KubeVirt usually makes them) with
	// two one-device requests: both devices come from one node, the
	// pod's. Deleting the pod deletes the generated claim, which frees
	// the devices for the next steps whichever node was picked.
	t.Run("two requests on one node", func(t *testing.T) {
		tmpl := controlplane.ClaimTemplate(ns, "two-gpus", controlplane.Requests("gpu", class, 2, "")...)
		created(t)(c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}))
		pod := controlplane.LauncherPod(ns, "virt-launcher-two", controlplane.PodClaim{
			Name: "gpus", ResourceClaimTemplateName: tmpl.Name, Requests: []string{"gpu0", "gpu1"},
		})
		created(t)(c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}))
		s, err := cp.WaitScheduled(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		claim := s.Claim("gpus")
		got := allocatedDevices(claim)
		if len(got) != 2 || got[0] == got[1] {
			t.Fatalf("allocated %v, want two different devices", got)
		}
		for _, d := range got {
			if !strings.HasPrefix(d, s.NodeName+"/") {
				t.Errorf("device %s is not on the pod's node %s", d, s.NodeName)
			}
		}
		t.Logf("pod on %s, claim %s got %v", s.NodeName, claim.Name, got)

		if err := cp.DeletePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitDeallocated(ctx, ns, claim.Name); err != nil {
			t.Fatal(err)
		}
	})

	// (2) A claim pinned by CEL to one device gets exactly that device and
	// takes the pod to the device's node.
	pinnedSel := `device.attributes["resource.kubernetes.io"].pciBusID == "0000:5d:00.0" && device.attributes["gpu.gpuherd.io"].node == "n2"`
	pinnedPod := controlplane.LauncherPod(ns, "virt-launcher-pinned", controlplane.PodClaim{Name: "gpu", ResourceClaimName: "pinned"})
	t.Run("pinned by CEL", func(t *testing.T) {
		claim := controlplane.Claim(ns, "pinned", controlplane.DeviceRequest{Name: "gpu0", DeviceClassName: class, Selector: pinnedSel})
		created(t)(c.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}))
		created(t)(c.CoreV1().Pods(ns).Create(ctx, pinnedPod, metav1.CreateOptions{}))
		s, err := cp.WaitScheduled(ctx, pinnedPod)
		if err != nil {
			t.Fatal(err)
		}
		if got := allocatedDevices(s.Claims[0]); s.NodeName != "n2" || len(got) != 1 || got[0] != "n2/gpu-0" {
			t.Fatalf("pod on %q with %v, want n2 with [n2/gpu-0]", s.NodeName, got)
		}
		// A running pod keeps its claim: nothing may release it yet.
		if _, err := cp.SetPodPhase(ctx, pinnedPod, v1.PodRunning); err != nil {
			t.Fatal(err)
		}
	})

	// (3) A further claim for the allocated device stays pending, with the
	// scheduler's "cannot allocate all claims"; (4) once the holder is
	// gone the claim is deallocated and the waiting pod gets the device.
	t.Run("allocated device stays taken", func(t *testing.T) {
		claim := controlplane.Claim(ns, "pinned-again", controlplane.DeviceRequest{Name: "gpu0", DeviceClassName: class, Selector: pinnedSel})
		created(t)(c.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}))
		pod := controlplane.LauncherPod(ns, "virt-launcher-second", controlplane.PodClaim{Name: "gpu", ResourceClaimName: claim.Name})
		created(t)(c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}))
		msg, err := cp.WaitUnschedulable(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, "cannot allocate all claims") {
			t.Fatalf("PodScheduled=False message %q lacks %q", msg, "cannot allocate all claims")
		}
		t.Logf("unschedulable: %s", msg)

		if err := cp.DeletePod(ctx, pinnedPod); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitDeallocated(ctx, ns, "pinned"); err != nil {
			t.Fatal(err)
		}
		s, err := cp.WaitScheduled(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		if got := allocatedDevices(s.Claims[0]); s.NodeName != "n2" || got[0] != "n2/gpu-0" {
			t.Fatalf("after release: pod on %q with %v, want n2 with [n2/gpu-0]", s.NodeName, got)
		}
	})

	t.Run("kubeconfig", func(t *testing.T) {
		path, err := cp.Kubeconfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := kc.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list nodes through the kubeconfig: %v", err)
		}
		if len(nodes.Items) != 2 {
			t.Fatalf("%d nodes, want 2", len(nodes.Items))
		}
	})

	dir := cp.Dir()
	cp.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("control plane directory %s left behind (%v)", dir, err)
	}
	checkGoroutines(t, append(processWideGoroutines, before)...)
}
