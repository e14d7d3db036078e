package platform

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra"
	"github.com/gpuherd/gpuherd/agent/dra/manifest"
	"github.com/gpuherd/gpuherd/tools/kube/controlplane"
	"github.com/gpuherd/gpuherd/tools/kube/fakekubelet"
	"github.com/gpuherd/gpuherd/vfio"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const ns = "vms"

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// rig is a control plane with two simulated DGX H100 servers as nodes.
type rig struct {
	cp     *controlplane.ControlPlane
	hv1    *Server
	hv2    *Server
	ctx    context.Context
	cancel context.CancelFunc
}

func newRig(t *testing.T) *rig {
	t.Helper()
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := ApplyDeviceClasses(ctx, cp); err != nil {
		t.Fatal(err)
	}
	r := &rig{cp: cp, ctx: ctx, cancel: cancel}
	r.hv1 = StartServer(t, cp, "hv-1", "dgx-h100", quiet())
	r.hv2 = StartServer(t, cp, "hv-2", "dgx-h100", quiet())
	for _, s := range []*Server{r.hv1, r.hv2} {
		if _, err := WaitSlice(ctx, cp, s.Name, func(d []resourceapi.Device) bool { return len(d) == 8 }); err != nil {
			t.Fatalf("%s never published its 8 GPUs: %v", s.Name, err)
		}
	}
	return r
}

func (r *rig) server(name string) *Server {
	if name == r.hv1.Name {
		return r.hv1
	}
	return r.hv2
}

// launch creates a virt-launcher-shaped pod and waits for the scheduler to
// place it with its claims allocated.
func (r *rig) launch(t *testing.T, name string, claims ...controlplane.PodClaim) *controlplane.Scheduled {
	t.Helper()
	pod := controlplane.LauncherPod(ns, "virt-launcher-"+name, claims...)
	if _, err := r.cp.Client.CoreV1().Pods(ns).Create(r.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := r.cp.WaitScheduled(r.ctx, pod)
	if err != nil {
		t.Fatalf("pod %s: %v", pod.Name, err)
	}
	return s
}

// metadata reads the device metadata a container of the prepared claim
// sees at path (KubeVirt's glob), as virt-launcher does: the file's first
// object, which must be of apiVersion metadata.resource.k8s.io/v1alpha1,
// its first device's pciBusID; a v1beta1 object follows it.
func metadata(t *testing.T, view *fakekubelet.ContainerView, glob string) string {
	t.Helper()
	files, err := view.Glob(glob)
	if err != nil || len(files) != 1 {
		t.Fatalf("metadata files at %s: %v, %v; want exactly one", glob, files, err)
	}
	host, ok := view.HostPathFor(files[0])
	if !ok {
		t.Fatalf("%s is not mounted from the host", files[0])
	}
	data, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bufio.NewReader(bytes.NewReader(data)))
	var versions []string
	var pciBusID string
	for {
		var doc struct {
			APIVersion string `json:"apiVersion"`
			Requests   []struct {
				Devices []struct {
					Attributes map[string]resourceapi.DeviceAttribute `json:"attributes"`
				} `json:"devices"`
			} `json:"requests"`
		}
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v\n%s", host, err, data)
		}
		versions = append(versions, doc.APIVersion)
		if len(doc.Requests) != 1 || len(doc.Requests[0].Devices) != 1 {
			t.Fatalf("metadata %s: want one request of one device:\n%s", host, data)
		}
		v := doc.Requests[0].Devices[0].Attributes["resource.kubernetes.io/pciBusID"].StringValue
		if v == nil {
			t.Fatalf("metadata %s has no pciBusID:\n%s", host, data)
		}
		if pciBusID == "" {
			pciBusID = *v
		} else if *v != pciBusID {
			t.Fatalf("metadata %s: the versions disagree on pciBusID:\n%s", host, data)
		}
	}
	if !slices.Equal(versions, []string{"metadata.resource.k8s.io/v1alpha1", "metadata.resource.k8s.io/v1beta1"}) {
		t.Fatalf("metadata %s holds %v; virt-launcher reads the first object, which must be v1alpha1", host, versions)
	}
	return pciBusID
}

// prepare plays the kubelet's NodePrepareResources for the pod's claims on
// their node and returns the container's view.
func (r *rig) prepare(t *testing.T, s *controlplane.Scheduled) *fakekubelet.ContainerView {
	t.Helper()
	srv := r.server(s.NodeName)
	res, err := srv.Kubelet.Prepare(r.ctx, s.Claims...)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range s.Claims {
		p := res[c.UID]
		if p.Err != "" {
			t.Fatalf("prepare of %s/%s on %s: %s", c.Namespace, c.Name, s.NodeName, p.Err)
		}
		ids = append(ids, p.CDIDeviceIDs()...)
	}
	view, err := fakekubelet.ApplyCDI(srv.CDIDir, ids)
	if err != nil {
		t.Fatal(err)
	}
	return view
}

func TestKubeVirtVMsOnGpuherd(t *testing.T) {
	r := newRig(t)

	// A VM with two GPUs, from a template, through the scheduler: both on
	// one node, claimed in gpuherd's ledger at prepare, bound, handed
	// over with their metadata where virt-launcher looks.
	tmpl := controlplane.ClaimTemplate(ns, "two-h100", controlplane.Requests("gpu", manifest.ModelClass(dra.DefaultDriverName, "NVIDIA H100 80GB"), 2, "")...)
	if _, err := r.cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(r.ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	plain := r.launch(t, "vm-1", controlplane.PodClaim{Name: "gpus", ResourceClaimTemplateName: "two-h100"})
	claim := plain.Claim("gpus")
	node, addrs := Allocated(claim)
	if node != plain.NodeName || len(addrs) != 2 {
		t.Fatalf("allocated %v on %s for a pod on %s", addrs, node, plain.NodeName)
	}
	view := r.prepare(t, plain)
	srv := r.server(plain.NodeName)
	id := dra.ClaimID(claim.Namespace, claim.Name, claim.UID)
	held, err := srv.Client.Get(r.ctx, id)
	if err != nil {
		t.Fatalf("gpuherd claim %s after prepare: %v", id, err)
	}
	var heldAddrs []string
	for _, g := range held.GPUs {
		heldAddrs = append(heldAddrs, g.PCIAddress)
		d, err := vfio.New(srv.Machine.Kernel).Device(g.PCIAddress)
		if err != nil || d.Driver != vfio.DriverVFIO {
			t.Errorf("%s on %q (%v) after prepare, want vfio-pci", g.PCIAddress, d.Driver, err)
		}
	}
	if !slices.Equal(heldAddrs, addrs) {
		t.Fatalf("gpuherd claim %s holds %v, the allocation is %v", id, heldAddrs, addrs)
	}
	for i := range 2 {
		req := manifest.RequestName(i)
		got := metadata(t, view, "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/"+req+"/*-metadata.json")
		want := ""
		for _, res := range claim.Status.Allocation.Devices.Results {
			if res.Request == req {
				want, _ = dra.PCIAddress(res.Device)
			}
		}
		if got != want {
			t.Errorf("metadata of %s says pciBusID %s, the allocation %s", req, got, want)
		}
	}
	var nodes []string
	for _, n := range view.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	if !slices.Contains(nodes, "/dev/vfio/vfio") || len(nodes) < 3 {
		t.Errorf("the container gets %v, want /dev/vfio/vfio and each GPU's group", nodes)
	}
	if devs, err := WaitSlice(r.ctx, r.cp, plain.NodeName, func(d []resourceapi.Device) bool { c, _ := Has(d, addrs[0]); return c == id }); err != nil {
		t.Fatalf("the slice never showed %s held by %s: %v", addrs[0], id, err)
	} else if len(devs) != 8 {
		t.Errorf("%d devices while Kubernetes holds 2, want all 8 (its own stay published)", len(devs))
	}

	// A libvirt VM takes a GPU of the other node: it leaves that node's
	// slice.
	other := r.hv2
	if plain.NodeName == r.hv2.Name {
		other = r.hv1
	}
	libvirt, err := other.Client.Claim(r.ctx, "libvirt-vm", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WaitSlice(r.ctx, r.cp, other.Name, func(d []resourceapi.Device) bool { _, ok := Has(d, libvirt.GPUs[0].PCIAddress); return !ok }); err != nil {
		t.Fatalf("%s's slice still offers %s after a libvirt VM took it: %v", other.Name, libvirt.GPUs[0].PCIAddress, err)
	}

	// An allocation is in gpuherd's ledger before its pod is prepared:
	// from then on nothing else can claim its GPU.
	<-other.Driver.WatchingAllocations()
	one := controlplane.Claim(ns, "one-h100", controlplane.Requests("gpu", dra.DefaultDriverName, 1, `device.attributes["gpu.gpuherd.io"].node == "`+other.Name+`"`)...)
	if _, err := r.cp.Client.ResourceV1().ResourceClaims(ns).Create(r.ctx, one, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale := r.launch(t, "vm-stale", controlplane.PodClaim{Name: "gpus", ResourceClaimName: "one-h100"})
	_, staleAddrs := Allocated(stale.Claims[0])
	oneID := dra.ClaimID(ns, "one-h100", stale.Claims[0].UID)
	if err := waitGPU(r.ctx, other, staleAddrs[0], func(g api.GPU) bool { return g.Claim == oneID }); err != nil {
		t.Fatalf("the allocation of %s never reached the ledger before its prepare: %v", staleAddrs[0], err)
	}
	_, err = other.Client.Claim(r.ctx, "libvirt-late", api.ClaimRequest{Devices: staleAddrs})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeNotAvailable {
		t.Fatalf("a libvirt claim of a GPU Kubernetes allocated: %v, want not available", err)
	}

	// The agent restarts between allocation and prepare: prepare fails
	// while it is down, and the kubelet's retry succeeds.
	other.StopAgent()
	res, err := other.Kubelet.Prepare(r.ctx, stale.Claims[0])
	if err != nil {
		t.Fatal(err)
	}
	if msg := res[stale.Claims[0].UID].Err; !strings.Contains(msg, "the gpuherd agent did not answer") {
		t.Fatalf("prepare with the agent down: %q", msg)
	}
	other.StartAgent(t)
	r.prepare(t, stale)
	if _, err := other.Client.Get(r.ctx, oneID); err != nil {
		t.Fatalf("the retried prepare claimed nothing: %v", err)
	}

	// A pod deleted before its prepare: its claim, deleted, is released.
	gone := controlplane.Claim(ns, "gone", controlplane.Requests("gpu", dra.DefaultDriverName, 1, `device.attributes["gpu.gpuherd.io"].node == "`+other.Name+`"`)...)
	if _, err := r.cp.Client.ResourceV1().ResourceClaims(ns).Create(r.ctx, gone, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pending := r.launch(t, "vm-gone", controlplane.PodClaim{Name: "gpus", ResourceClaimName: "gone"})
	_, goneAddrs := Allocated(pending.Claims[0])
	goneID := dra.ClaimID(ns, "gone", pending.Claims[0].UID)
	if err := waitGPU(r.ctx, other, goneAddrs[0], func(g api.GPU) bool { return g.Claim == goneID }); err != nil {
		t.Fatal(err)
	}
	if err := r.cp.DeletePod(r.ctx, pending.Pod); err != nil {
		t.Fatal(err)
	}
	if err := r.cp.Client.ResourceV1().ResourceClaims(ns).Delete(r.ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitGPU(r.ctx, other, goneAddrs[0], func(g api.GPU) bool { return g.Claim == "" }); err != nil {
		t.Fatalf("a claim deleted before its prepare kept %s: %v", goneAddrs[0], err)
	}

	// A node whose driver claims at prepare only (credentials that may
	// not list ResourceClaims): a libvirt VM takes the allocated GPU in
	// between, and the stale allocation is refused with gpuherd's sentence.
	hv3 := StartServerWith(t, r.cp, "hv-3", "dgx-h100", quiet(), Options{ClaimAtPrepareOnly: true})
	if _, err := WaitSlice(r.ctx, r.cp, hv3.Name, func(d []resourceapi.Device) bool { return len(d) == 8 }); err != nil {
		t.Fatal(err)
	}
	late := controlplane.Claim(ns, "late", controlplane.Requests("gpu", dra.DefaultDriverName, 1, `device.attributes["gpu.gpuherd.io"].node == "hv-3"`)...)
	if _, err := r.cp.Client.ResourceV1().ResourceClaims(ns).Create(r.ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale3 := r.launch(t, "vm-late", controlplane.PodClaim{Name: "gpus", ResourceClaimName: "late"})
	_, lateAddrs := Allocated(stale3.Claims[0])
	if _, err := hv3.Client.Claim(r.ctx, "libvirt-between", api.ClaimRequest{Devices: lateAddrs}); err != nil {
		t.Fatalf("a libvirt claim before the prepare, on a node that claims at prepare: %v", err)
	}
	res, err = hv3.Kubelet.Prepare(r.ctx, stale3.Claims[0])
	if err != nil {
		t.Fatal(err)
	}
	if msg := res[stale3.Claims[0].UID].Err; !strings.Contains(msg, "The following GPUs are not available: "+lateAddrs[0]+" (held by gpuherd claim libvirt-between)") {
		t.Fatalf("prepare of a stale allocation: %q", msg)
	}

	// Unprepare frees: the pod's claim is released in gpuherd's ledger,
	// and its GPUs are offered again.
	errs, err := r.server(plain.NodeName).Kubelet.Unprepare(r.ctx, claim)
	if err != nil || errs[claim.UID] != "" {
		t.Fatalf("unprepare: %v %v", err, errs)
	}
	if _, err := srv.Client.Get(r.ctx, id); err == nil {
		t.Fatalf("gpuherd claim %s still held after unprepare", id)
	}
	if _, err := WaitSlice(r.ctx, r.cp, plain.NodeName, func(d []resourceapi.Device) bool { c, ok := Has(d, addrs[0]); return ok && c == "" }); err != nil {
		t.Fatalf("%s not offered free again: %v", addrs[0], err)
	}
	if err := r.cp.DeletePod(r.ctx, plain.Pod); err != nil {
		t.Fatal(err)
	}
}

// Claim first: gpuherd chooses the server and the GPUs, answering at once;
// the VM's ResourceClaim pinned to them sends the launcher pod there with
// exactly those GPUs, and no plain claim ever gets them.
func TestKubeVirtClaimFirst(t *testing.T) {
	r := newRig(t)

	// Fill hv-1 so that gpuherd has one choice for 4 GPUs: hv-2.
	if _, err := r.hv1.Client.Claim(r.ctx, "libvirt-big", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 6}}}); err != nil {
		t.Fatal(err)
	}
	c, err := r.hv2.Client.Claim(r.ctx, "vm-7", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 4}}, Labels: map[string]string{api.LabelKubernetes: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	// Not available anywhere: gpuherd says so at once, with alternatives.
	_, err = r.hv2.Client.Claim(r.ctx, "vm-8", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 5}}, Labels: map[string]string{api.LabelKubernetes: "true"}})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeNotAvailable || !strings.HasPrefix(ae.Message, "The following GPUs are not available: 5x NVIDIA H100 80GB") {
		t.Fatalf("a claim no server can hold: %v", err)
	}

	rc, err := PinnedClaim(c, manifest.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WaitSlice(r.ctx, r.cp, "hv-2", func(d []resourceapi.Device) bool { cl, _ := Has(d, c.GPUs[0].PCIAddress); return cl == "vm-7" }); err != nil {
		t.Fatalf("vm-7's GPUs never published with their claim: %v", err)
	}
	if _, err := r.cp.Client.ResourceV1().ResourceClaims(ns).Create(r.ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var reqs []string
	for i := range c.GPUs {
		reqs = append(reqs, manifest.RequestName(i))
	}
	s := r.launch(t, "vm-7", controlplane.PodClaim{Name: "gpus", ResourceClaimName: rc.Name, Requests: reqs})
	node, addrs := Allocated(s.Claims[0])
	var want []string
	for _, g := range c.GPUs {
		want = append(want, g.PCIAddress)
	}
	if s.NodeName != c.Node || node != c.Node || !slices.Equal(addrs, want) {
		t.Fatalf("pod on %s with %v on %s; gpuherd placed vm-7 on %s with %v", s.NodeName, addrs, node, c.Node, want)
	}
	view := r.prepare(t, s)
	got := metadata(t, view, "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/"+rc.Name+"/gpu0/*-metadata.json")
	first := ""
	for _, res := range s.Claims[0].Status.Allocation.Devices.Results {
		if res.Request == "gpu0" {
			first, _ = dra.PCIAddress(res.Device)
		}
	}
	if got != first {
		t.Errorf("metadata of gpu0: %s, allocation %s", got, first)
	}
	held, err := r.hv2.Client.Get(r.ctx, "vm-7")
	if err != nil || held.Domain == nil || held.Domain.UUID != string(s.Pod.UID) {
		t.Fatalf("vm-7 after prepare: %+v %v; want in use by pod %s", held.Domain, err, s.Pod.UID)
	}

	// hv-1 has 2 free, hv-2 4 free beside vm-7's: a plain claim of 5 H100
	// fits nowhere, for vm-7's GPUs are not offered to it.
	five := controlplane.Claim(ns, "five", controlplane.Requests("gpu", dra.DefaultDriverName, 5, "")...)
	if _, err := r.cp.Client.ResourceV1().ResourceClaims(ns).Create(r.ctx, five, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pending := controlplane.LauncherPod(ns, "virt-launcher-five", controlplane.PodClaim{Name: "gpus", ResourceClaimName: "five"})
	if _, err := r.cp.Client.CoreV1().Pods(ns).Create(r.ctx, pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg, err := r.cp.WaitUnschedulable(r.ctx, pending)
	if err != nil || !strings.Contains(msg, "cannot allocate all claims") {
		t.Fatalf("a plain claim that only vm-7's GPUs could complete: %q %v", msg, err)
	}

	// The VM stops: unprepare ends the pod's use; the claim stays until the
	// platform releases it.
	errs, err := r.hv2.Kubelet.Unprepare(r.ctx, s.Claims[0])
	if err != nil || errs[s.Claims[0].UID] != "" {
		t.Fatalf("unprepare: %v %v", err, errs)
	}
	if held, err := r.hv2.Client.Get(r.ctx, "vm-7"); err != nil || held.Domain != nil || held.State != api.StateClaimed {
		t.Fatalf("vm-7 after unprepare: %+v %v", held, err)
	}
}
