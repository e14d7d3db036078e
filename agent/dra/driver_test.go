package dra

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

const testNode = "hv-1"

// rig is a real agent on a simulated DGX H100, reached over its API on a
// unix socket as the driver reaches it in production, and a driver that
// is not registered with any kubelet: the tests call its plugin methods.
type rig struct {
	m      *sim.Machine
	a      *agent.Agent
	client *api.Client
	d      *Driver
	st     api.Status
}

func shortTemp(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gh-dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newRig(t *testing.T) *rig { return newRigTB(t) }

func newRigTB(t testing.TB, opts ...agent.Option) *rig {
	t.Helper()
	dir := shortTemp(t)
	p, err := sim.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	m, err := sim.Start(p, filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.NodeName = testNode
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Socket = filepath.Join(dir, "api.sock")
	cfg.IdleDriver = "nvidia"
	log := slog.New(slog.DiscardHandler)
	a, err := agent.New(context.Background(), cfg, log, append([]agent.Option{agent.WithSysfs(m.Kernel, m.NVML)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	t.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent: %v", err)
	}
	client := api.NewClient(cfg.Socket)
	t.Cleanup(client.Close)
	d, err := newDriver(Config{NodeName: testNode, Agent: client, PluginDataDir: filepath.Join(dir, "plugin"), CDIDir: filepath.Join(dir, "cdi")})
	if err != nil {
		t.Fatal(err)
	}
	st, err := client.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &rig{m: m, a: a, client: client, d: d, st: st}
}

// allocation is a ResourceClaim the scheduler allocated devices to, each
// request one device of this driver on this node unless told otherwise.
func allocation(name, uid string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: name, UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "virt-launcher-" + name, UID: types.UID("pod-" + uid)}},
		},
	}
	for i, dev := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu" + string(rune('0'+i)), Driver: DefaultDriverName, Pool: testNode, Device: dev,
		})
	}
	return c
}

func (r *rig) prepare(t *testing.T, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	res, err := r.d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	got, ok := res[c.UID]
	if !ok || len(res) != 1 {
		t.Fatalf("prepare answered %v, want one result for %s", res, c.UID)
	}
	return got
}

func (r *rig) unprepare(t *testing.T, c *resourceapi.ResourceClaim) error { return r.unprepareTB(t, c) }

func (r *rig) unprepareTB(t testing.TB, c *resourceapi.ResourceClaim) error {
	t.Helper()
	res, err := r.d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}})
	if err != nil {
		t.Fatalf("unprepare: %v", err)
	}
	if len(res) != 1 {
		t.Fatalf("unprepare answered %v, want one result", res)
	}
	return res[c.UID]
}

func (r *rig) gpu(t *testing.T, addr string) api.GPU {
	t.Helper()
	st, err := r.client.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.GPUs {
		if g.PCIAddress == addr {
			return g
		}
	}
	t.Fatalf("no GPU %s", addr)
	return api.GPU{}
}

func TestDeviceNames(t *testing.T) {
	for _, addr := range []string{"0000:3b:00.0", "0000:5d:00.7", "abcd:ef:1f.3"} {
		name := DeviceName(addr)
		back, ok := PCIAddress(name)
		if !ok || back != addr {
			t.Errorf("PCIAddress(DeviceName(%s) = %s) = %s, %v", addr, name, back, ok)
		}
	}
	for _, bad := range []string{"", "gpu-", "gpu-0000-3b-00-8", "gpu-0000-3B-00-0", "nic-0000-3b-00-0", "gpu-0000-3b-00-0-x", "gpu-00000-3b-00-0", "gpu-0000:3b:00.0",
		"gpu-0:00-3b-00-0", "gpu-0000-3.-00-0", "gpu-000.-3b-00-0", "gpu-0000-3b-00-:"} {
		if a, ok := PCIAddress(bad); ok {
			t.Errorf("PCIAddress(%q) = %s, want refused", bad, a)
		}
	}
}

// The slice offers every free, ready GPU and the GPUs of Kubernetes'
// claims (with the claim), and never a GPU a libvirt VM holds.
func TestSliceFromTheLedger(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	if len(Devices(r.st, DefaultDriverName)) != 8 {
		t.Fatalf("%d devices on an idle DGX H100, want 8", len(Devices(r.st, DefaultDriverName)))
	}
	libvirt, err := r.client.Claim(ctx, "vm-libvirt", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := r.client.Claim(ctx, "vm-kubevirt", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}, Labels: map[string]string{api.LabelKubernetes: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Drain(ctx, r.st.GPUs[7].PCIAddress, "maintenance"); err != nil {
		t.Fatal(err)
	}
	st, err := r.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	devs := Devices(st, DefaultDriverName)
	byName := map[string]resourceapi.Device{}
	for _, d := range devs {
		byName[d.Name] = d
	}
	for _, g := range libvirt.GPUs {
		if _, ok := byName[DeviceName(g.PCIAddress)]; ok {
			t.Errorf("%s of a libvirt VM is in the slice", g.PCIAddress)
		}
	}
	if _, ok := byName[DeviceName(st.GPUs[7].PCIAddress)]; ok && st.GPUs[7].Claim == "" {
		t.Errorf("drained %s is in the slice", st.GPUs[7].PCIAddress)
	}
	fd, ok := byName[DeviceName(first.GPUs[0].PCIAddress)]
	if !ok {
		t.Fatalf("%s of a claim made first for KubeVirt is not in the slice", first.GPUs[0].PCIAddress)
	}
	own := func(n string) resourceapi.QualifiedName {
		return resourceapi.QualifiedName(DefaultDriverName + "/" + n)
	}
	if v := fd.Attributes[own(attrClaim)].StringValue; v == nil || *v != "vm-kubevirt" {
		t.Errorf("claim attribute %v, want vm-kubevirt", v)
	}
	if len(devs) != 8-2-1 {
		t.Errorf("%d devices, want 5 (8 less 2 of libvirt, 1 drained)", len(devs))
	}
	for _, d := range devs {
		addr, _ := PCIAddress(d.Name)
		if v := d.Attributes[attrPCIBusID].StringValue; v == nil || *v != addr {
			t.Errorf("%s: pciBusID %v, want %s", d.Name, v, addr)
		}
		if v := d.Attributes[own(attrModel)].StringValue; v == nil || *v != "NVIDIA H100 80GB" {
			t.Errorf("%s: model %v", d.Name, v)
		}
		if v := d.Attributes[attrPCIeRoot].StringValue; v == nil || *v != "pci0000:00" {
			t.Errorf("%s: pcieRoot %v, want the simulated root pci0000:00", d.Name, v)
		}
		if d.Attributes[own(attrIOMMUGroup)].IntValue == nil || d.Attributes[attrNUMANode].IntValue == nil {
			t.Errorf("%s: no IOMMU group or NUMA node: %v", d.Name, d.Attributes)
		}
		if c := d.Capacity[own(capMemory)]; c.Value.Value() != 80<<30 {
			t.Errorf("%s: memory %v, want 80Gi", d.Name, c.Value.String())
		}
		if v := d.Attributes[own(attrClaim)].StringValue; d.Name != fd.Name && (v == nil || *v != "") {
			t.Errorf("%s: claim attribute %v, want empty (free)", d.Name, v)
		}
	}
}

// Prepare claims exactly the allocated GPUs under the ResourceClaim's ID,
// binds them, writes their CDI devices and hands over their metadata; a
// retry answers the same; unprepare releases, and again is no error.
func TestPrepareClaimsTheAllocation(t *testing.T) {
	r := newRig(t)
	a0, a1 := r.st.GPUs[3].PCIAddress, r.st.GPUs[6].PCIAddress
	c := allocation("vm-a", "0f1e2d3c-0000-4000-8000-000000000001", DeviceName(a0), DeviceName(a1))
	res := r.prepare(t, c)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	id := ClaimID("vms", "vm-a", c.UID)
	if id != "k8s.vms.vm-a.0f1e2d3c" {
		t.Fatalf("claim ID %s", id)
	}
	held, err := r.client.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, g := range held.GPUs {
		addrs = append(addrs, g.PCIAddress)
		if d, _ := vfio.New(r.m.Kernel).Device(g.PCIAddress); d.Driver != vfio.DriverVFIO {
			t.Errorf("%s on %q, want vfio-pci", g.PCIAddress, d.Driver)
		}
	}
	if want := slices.Sorted(slices.Values([]string{a0, a1})); !slices.Equal(addrs, want) {
		t.Fatalf("gpuherd claim holds %v, want %v", addrs, want)
	}
	if held.Labels[api.LabelResourceClaimUID] != string(c.UID) || held.Labels[api.LabelResourceClaim] != "vms/vm-a" {
		t.Errorf("labels %v", held.Labels)
	}
	if len(res.Devices) != 2 {
		t.Fatalf("devices %+v", res.Devices)
	}
	for i, dev := range res.Devices {
		if dev.Requests[0] != c.Status.Allocation.Devices.Results[i].Request || dev.PoolName != testNode || dev.DeviceName != c.Status.Allocation.Devices.Results[i].Device {
			t.Errorf("device %d: %+v", i, dev)
		}
		addr, _ := PCIAddress(dev.DeviceName)
		if v := dev.Metadata.Attributes[string(attrPCIBusID)].StringValue; v == nil || *v != addr {
			t.Errorf("metadata pciBusID %v, want %s", v, addr)
		}
		if len(dev.CDIDeviceIDs) != 1 || dev.CDIDeviceIDs[0] != DefaultDriverName+"/vfio="+string(c.UID)+"-"+dev.DeviceName {
			t.Errorf("CDI IDs %v", dev.CDIDeviceIDs)
		}
	}
	var spec cdispec.Spec
	data, err := os.ReadFile(r.d.cdiSpecPath(string(c.UID)))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Kind != DefaultDriverName+"/vfio" || len(spec.Devices) != 2 {
		t.Fatalf("CDI spec %s", data)
	}
	for _, dev := range spec.Devices {
		var paths []string
		for _, n := range dev.ContainerEdits.DeviceNodes {
			paths = append(paths, n.Path)
		}
		if len(paths) != 2 || paths[0] != "/dev/vfio/vfio" || !strings.HasPrefix(paths[1], "/dev/vfio/") {
			t.Errorf("CDI device %s: nodes %v, want /dev/vfio/vfio and the group", dev.Name, paths)
		}
	}

	again := r.prepare(t, c)
	if again.Err != nil || len(again.Devices) != 2 {
		t.Fatalf("retry: %v, %+v", again.Err, again.Devices)
	}

	if err := r.unprepare(t, c); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Get(context.Background(), id); !api.IsCode(err, api.CodeNotFound) {
		t.Fatalf("after unprepare: %v, want not found", err)
	}
	if _, err := os.Stat(r.d.cdiSpecPath(string(c.UID))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CDI spec left behind: %v", err)
	}
	if g := r.gpu(t, a0); g.State != api.StateFree {
		t.Errorf("%s is %s after unprepare, want free", a0, g.State)
	}
	if err := r.unprepare(t, c); err != nil {
		t.Fatalf("second unprepare: %v", err)
	}
}

// Every refusal names the ResourceClaim and what is wrong, and none takes
// a GPU.
func TestPrepareRefusals(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	g := func(i int) string { return DeviceName(r.st.GPUs[i].PCIAddress) }
	if _, err := r.client.Claim(ctx, "vm-libvirt", api.ClaimRequest{Devices: []string{r.st.GPUs[0].PCIAddress}}); err != nil {
		t.Fatal(err)
	}
	ok := allocation("twice", "00000000-0000-4000-8000-0000000000aa", g(1))
	if res := r.prepare(t, ok); res.Err != nil {
		t.Fatal(res.Err)
	}

	otherNode := allocation("far", "00000000-0000-4000-8000-000000000001", g(2))
	otherNode.Status.Allocation.Devices.Results[0].Pool = "hv-2"
	unknown := allocation("unknown", "00000000-0000-4000-8000-000000000002", "nvme-0")
	absent := allocation("absent", "00000000-0000-4000-8000-000000000003", DeviceName("0000:ee:00.0"))
	stale := allocation("stale", "00000000-0000-4000-8000-000000000004", g(0))
	otherDevices := allocation("twice", "00000000-0000-4000-8000-0000000000aa", g(2))
	notAllocated := allocation("pending", "00000000-0000-4000-8000-000000000005")
	notAllocated.Status.Allocation = nil
	doubled := allocation("doubled", "00000000-0000-4000-8000-000000000006", g(2), g(2))
	shared := allocation("shared", "00000000-0000-4000-8000-000000000007", g(2))
	share := types.UID("s-1")
	shared.Status.Allocation.Devices.Results[0].ShareID = &share
	pinnedWrong := allocation("pinned", "00000000-0000-4000-8000-000000000008", g(2))
	pinnedWrong.Annotations = map[string]string{api.AnnotationClaim: "vm-libvirt"}

	for _, tc := range []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{otherNode, "belongs to another node than hv-1"},
		{unknown, `device "nvme-0" is not a gpuherd device`},
		{absent, "hv-1 has no GPU at 0000:ee:00.0"},
		{stale, "The following GPUs are not available: " + r.st.GPUs[0].PCIAddress + " (held by gpuherd claim vm-libvirt)"},
		{otherDevices, "holds other GPUs than its allocation"},
		{notAllocated, "is not allocated"},
		{doubled, "is allocated twice"},
		{shared, "whole GPUs only"},
		{pinnedWrong, "is pinned to gpuherd claim vm-libvirt (annotation gpuherd.io/claim), but its device " + g(2) + " is free"},
	} {
		t.Run(tc.claim.Name, func(t *testing.T) {
			res := r.prepare(t, tc.claim)
			if res.Err == nil || !strings.Contains(res.Err.Error(), tc.want) || !strings.Contains(res.Err.Error(), "ResourceClaim vms/"+tc.claim.Name) {
				t.Fatalf("prepare = %v, want an error naming the claim and %q", res.Err, tc.want)
			}
		})
	}
	st, err := r.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, g := range st.GPUs {
		if g.Claim != "" {
			held++
		}
	}
	if held != 2 {
		t.Errorf("%d GPUs held after the refusals, want 2 (vm-libvirt and twice)", held)
	}

	// Garbage from the API server: an identity it never writes is not
	// used to build a path or an ID.
	for _, c := range []*resourceapi.ResourceClaim{
		allocation("bad-uid", "../../../etc/passwd", g(3)),
		allocation("Bad_Name", "00000000-0000-4000-8000-000000000010", g(3)),
	} {
		if res := r.prepare(t, c); res.Err == nil || !strings.Contains(res.Err.Error(), "not a namespace, name and UID the API server makes") {
			t.Errorf("prepare of %s (%s): %v", c.Name, c.UID, res.Err)
		}
		if err := r.unprepare(t, c); err == nil {
			t.Errorf("unprepare of %s (%s) accepted", c.Name, c.UID)
		}
	}

	// A device of another driver is not this driver's business.
	foreign := allocation("nic", "00000000-0000-4000-8000-000000000009", "eth0")
	foreign.Status.Allocation.Devices.Results[0].Driver = "sriov.example.com"
	if res := r.prepare(t, foreign); res.Err != nil || len(res.Devices) != 0 {
		t.Errorf("another driver's device: %v, %+v; want nothing done", res.Err, res.Devices)
	}
}

// Claim first: the platform claims, then creates the VM's ResourceClaims
// pinned to the claim; prepare takes no new claim but marks the claim in
// use by the pod, and unprepare leaves the claim for the platform to
// release.
func TestPrepareAClaimMadeFirst(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	first, err := r.client.Claim(ctx, "vm-7", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 2}}, Labels: map[string]string{api.LabelKubernetes: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	var claims []*resourceapi.ResourceClaim
	for i, g := range first.GPUs {
		c := allocation("vm-7-gpu"+string(rune('0'+i)), "00000000-0000-4000-8000-00000000070"+string(rune('0'+i)), DeviceName(g.PCIAddress))
		c.Annotations = map[string]string{api.AnnotationClaim: "vm-7"}
		c.Status.ReservedFor[0].UID = "launcher-pod-uid"
		claims = append(claims, c)
	}
	for _, c := range claims {
		if res := r.prepare(t, c); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	held, err := r.client.Get(ctx, "vm-7")
	if err != nil || held.Domain == nil || held.Domain.UUID != "launcher-pod-uid" {
		t.Fatalf("vm-7 = %+v, %v; want in use by the launcher pod", held.Domain, err)
	}
	// A generic ResourceClaim allocated a GPU of vm-7 is refused.
	stray := allocation("stray", "00000000-0000-4000-8000-000000000799", DeviceName(first.GPUs[0].PCIAddress))
	if res := r.prepare(t, stray); res.Err == nil || !strings.Contains(res.Err.Error(), "held by gpuherd claim vm-7") {
		t.Fatalf("generic claim on vm-7's GPU: %v", res.Err)
	}
	for _, c := range claims {
		if err := r.unprepare(t, c); err != nil {
			t.Fatal(err)
		}
	}
	held, err = r.client.Get(ctx, "vm-7")
	if err != nil || held.State != api.StateClaimed || held.Domain != nil {
		t.Fatalf("after unprepare vm-7 = %+v, %v; want still claimed, in use by nobody", held, err)
	}
}

// Unprepare waits for the VM's QEMU: while it holds a GPU's VFIO group
// open the claim stays, and the kubelet's retry after it exits frees it.
func TestUnprepareWaitsForTheVFIOGroup(t *testing.T) {
	r := newRig(t)
	addr := r.st.GPUs[4].PCIAddress
	c := allocation("vm-q", "00000000-0000-4000-8000-00000000000f", DeviceName(addr))
	if res := r.prepare(t, c); res.Err != nil {
		t.Fatal(res.Err)
	}
	stop, err := r.m.Kernel.OpenGroup(r.st.GPUs[4].IOMMUGroup, fakekernel.Process{PID: 4321, Comm: "qemu-kvm", Cmdline: []string{"/usr/libexec/qemu-kvm", "-name", "guest=vms_vm-q"}})
	if err != nil {
		t.Fatal(err)
	}
	err = r.unprepare(t, c)
	if err == nil || !strings.Contains(err.Error(), "still in use") || !strings.Contains(err.Error(), "pid 4321") {
		t.Fatalf("unprepare while QEMU runs = %v, want refused naming pid 4321", err)
	}
	if g := r.gpu(t, addr); g.State != api.StateClaimed {
		t.Fatalf("%s is %s, want still claimed", addr, g.State)
	}
	stop()
	if err := r.unprepare(t, c); err != nil {
		t.Fatal(err)
	}
	if g := r.gpu(t, addr); g.State != api.StateFree {
		t.Fatalf("%s is %s, want free", addr, g.State)
	}
}

// A crash after the checkpoint but before the claim, or after the claim
// but before the answer: the kubelet's retry of prepare finishes it, and
// unprepare frees it even with the checkpoint lost.
func TestPrepareAfterACrash(t *testing.T) {
	r := newRig(t)
	addr := r.st.GPUs[5].PCIAddress
	c := allocation("vm-c", "00000000-0000-4000-8000-0000000000c0", DeviceName(addr))
	// As if the driver died after claiming: the claim exists, no CDI spec.
	id := ClaimID(c.Namespace, c.Name, c.UID)
	if _, err := r.client.Claim(context.Background(), id, api.ClaimRequest{Devices: []string{addr}, Labels: map[string]string{
		api.LabelResourceClaim: "vms/vm-c", api.LabelResourceClaimUID: string(c.UID)}}); err != nil {
		t.Fatal(err)
	}
	res := r.prepare(t, c)
	if res.Err != nil || len(res.Devices) != 1 {
		t.Fatalf("prepare after the crash: %v %+v", res.Err, res.Devices)
	}
	// A new driver process, its checkpoint gone.
	if err := os.Remove(filepath.Join(r.d.cfg.PluginDataDir, checkpointFile)); err != nil {
		t.Fatal(err)
	}
	d2, err := newDriver(r.d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.d = d2
	if err := r.unprepare(t, c); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Get(context.Background(), id); !api.IsCode(err, api.CodeNotFound) {
		t.Fatalf("claim after unprepare: %v, want released", err)
	}
}

func TestClaimIDs(t *testing.T) {
	long := strings.Repeat("n", 253)
	id := ClaimID("tenant-a", long, "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9")
	if len(id) > maxClaimID || !strings.HasSuffix(id, ".0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9") || !strings.HasPrefix(id, "k8s.tenant-a.nnn") {
		t.Errorf("long name: %s (%d)", id, len(id))
	}
	if a, b := ClaimID("ns", "c", "11111111-aaaa"), ClaimID("ns", "c", "22222222-aaaa"); a == b {
		t.Errorf("two UIDs, one ID %s", a)
	}
}

func TestDriverNames(t *testing.T) {
	for _, ok := range []string{"gpu.gpuherd.io", "gpu.example.com"} {
		if err := validDriverName(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "gpu", "GPU.example.com", "gpu..io", "-gpu.io", "gpu_x.io", strings.Repeat("a", 62) + ".io"} {
		if err := validDriverName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A watch outlives the deadline for reading a request: a quiet server
// answers after the whole wait with its unchanged status, and a change
// during the wait is answered at once.
func TestWatchOutlivesTheRequestReadDeadline(t *testing.T) {
	r := newRigTB(t, agent.WithRequestReadTimeout(100*time.Millisecond))
	ctx := context.Background()
	start := time.Now()
	st, err := r.client.WatchStatus(ctx, r.st.Generation, 400*time.Millisecond)
	if err != nil {
		t.Fatalf("watch past the read deadline: %v", err)
	}
	if st.Generation != r.st.Generation || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("quiet watch: generation %d after %s, want %d after the whole wait", st.Generation, time.Since(start), r.st.Generation)
	}
	done := make(chan api.Status, 1)
	go func() {
		st, err := r.client.WatchStatus(ctx, r.st.Generation, time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- st
	}()
	if _, err := r.client.Drain(ctx, r.st.GPUs[0].PCIAddress, "test"); err != nil {
		t.Fatal(err)
	}
	if st := <-done; st.Generation == r.st.Generation || st.GPUs[0].State != api.StateDrained {
		t.Fatalf("watch after a drain: generation %d, GPU %s", st.Generation, st.GPUs[0].State)
	}
}

// An allocation seen by the watcher is claimed before its prepare; one
// that goes away unprepared is released, a prepared one is left to
// unprepare; a claim made first is not the watcher's.
func TestAllocationsAdoptedAndDropped(t *testing.T) {
	r := newRig(t)
	r.d.ctx = context.Background()
	ctx := context.Background()
	a0, a1 := r.st.GPUs[0].PCIAddress, r.st.GPUs[1].PCIAddress
	early := allocation("early", "00000000-0000-4000-8000-0000000000e1", DeviceName(a0))
	r.d.adopt(ctx, early)
	if g := r.gpu(t, a0); g.Claim != ClaimID("vms", "early", early.UID) {
		t.Fatalf("after the allocation was seen %s is held by %q", a0, g.Claim)
	}
	r.d.adopt(ctx, early) // the informer's resync: nothing new
	if res := r.prepare(t, early); res.Err != nil {
		t.Fatal(res.Err)
	}
	r.d.drop(ctx, string(early.UID)) // prepared: the kubelet's to unprepare
	if g := r.gpu(t, a0); g.Claim == "" {
		t.Fatal("a prepared claim was released by the watcher")
	}

	gone := allocation("gone", "00000000-0000-4000-8000-0000000000e2", DeviceName(a1))
	r.d.adopt(ctx, gone)
	if g := r.gpu(t, a1); g.Claim == "" {
		t.Fatal("the second allocation was not adopted")
	}
	r.d.drop(ctx, string(gone.UID))
	if g := r.gpu(t, a1); g.Claim != "" || g.State != api.StateFree {
		t.Fatalf("an allocation gone before its prepare kept %s (%s, %q)", a1, g.State, g.Claim)
	}
	if _, ok := r.d.state.get(string(gone.UID)); ok {
		t.Error("the dropped claim is still in the checkpoint")
	}
}
