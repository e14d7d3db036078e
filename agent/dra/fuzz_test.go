package dra

import (
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// FuzzClaimFromTheAPIServer feeds what a broken or hostile API server could
// answer: any namespace, name, UID and allocated device. Nothing panics,
// a claim that passes names only this node's GPUs, its claim ID is one
// gpuherd accepts, and its CDI spec stays in the CDI directory.
func FuzzClaimFromTheAPIServer(f *testing.F) {
	f.Add("vms", "vm-1", "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", "gpu.gpuherd.io", "hv-1", "gpu-0000-3b-00-0", "gpu0")
	f.Add("../..", "x", "../../../etc/passwd", "gpu.gpuherd.io", "hv-1", "gpu-0000-3b-00-0", "gpu0")
	f.Add("vms", "vm-1", "abc", "gpu.gpuherd.io", "hv-1", "gpu-../../../x", "gpu0/sub")
	f.Add("", "", "", "", "", "", "")
	f.Add("vms", strings.Repeat("n", 300), "0f1e2d3c", "gpu.gpuherd.io", "hv-2", "gpu-0000-3b-00-9", "r")
	d := &Driver{cfg: Config{DriverName: DefaultDriverName, NodeName: "hv-1", CDIDir: "/var/run/cdi"}}
	f.Fuzz(func(t *testing.T, ns, name, uid, driver, pool, device, request string) {
		c := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: request, Driver: driver, Pool: pool, Device: device}},
			}}},
		}
		allocs, err := d.ours(c)
		if err != nil {
			return
		}
		for _, a := range allocs {
			if driver != DefaultDriverName || pool != "hv-1" || DeviceName(a.addr) != device {
				t.Fatalf("passed %+v of driver %q pool %q", a, driver, pool)
			}
		}
		if p := d.cdiSpecPath(uid); filepath.Dir(p) != "/var/run/cdi" {
			t.Fatalf("CDI spec of UID %q at %s", uid, p)
		}
		id := ClaimID(ns, name, types.UID(uid))
		if len(id) > maxClaimID {
			t.Fatalf("claim ID %q is %d long", id, len(id))
		}
		for i := 0; i < len(id); i++ {
			if c := id[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
				t.Fatalf("claim ID %q has %q", id, c)
			}
		}
	})
}
