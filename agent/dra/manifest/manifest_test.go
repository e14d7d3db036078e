package manifest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/inventory"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"pgregory.net/rapid"
	"sigs.k8s.io/yaml"
)

// The objects are Kubernetes' own (strict decoding into k8s.io/api's
// types below); only this package's tests import them, the gpuherd
// binary does not.

var update = flag.Bool("update", false, "rewrite testdata/*.yaml from this package's output")

// The manifests are byte for byte what gpuherd wrote when it rendered
// k8s.io/api's own types (the files were written by that version):
// operators' `kubectl apply` and diffs of them see no change.
func TestGolden(t *testing.T) {
	var catalog []string
	for _, m := range inventory.DefaultCatalog().Models() {
		catalog = append(catalog, m.Name)
	}
	k8s := map[string]string{api.LabelKubernetes: "true"}
	eight := api.Claim{ID: "BIG", Node: "dgx-1", State: api.StateClaimed, Labels: k8s,
		Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 8}}}
	for _, a := range []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"} {
		eight.GPUs = append(eight.GPUs, api.ClaimGPU{PCIAddress: a})
	}
	for _, tc := range []struct {
		file   string
		render func() ([]byte, error)
	}{
		{"deviceclasses-catalog.yaml", func() ([]byte, error) { return DeviceClassesYAML(DefaultDriverName, catalog) }},
		{"deviceclasses-odd.yaml", func() ([]byte, error) {
			return DeviceClassesYAML("gpus.example.com", []string{"NVIDIA H100 80GB", `Odd "quoted" \ model`, "NVIDIA H100 80GB", "line\nbreak", "gpus.example.com"})
		}},
		{"kubevirt-two.yaml", func() ([]byte, error) {
			return KubeVirtManifests(api.Claim{ID: "vm_7", Node: "hv-1", State: api.StateClaimed, Labels: k8s,
				Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 2}},
				GPUs:  []api.ClaimGPU{{PCIAddress: "0000:18:00.0"}, {PCIAddress: "0000:2a:00.0"}}}, Options{Namespace: "vms"})
		}},
		{"kubevirt-one-named.yaml", func() ([]byte, error) {
			return KubeVirtManifests(api.Claim{ID: "tenant-a.node-0", Node: `hv "quoted"`, State: api.StateClaimed, Labels: k8s,
				Items: []api.Item{{Model: "NVIDIA L40S", Count: 1}, {Model: "NVIDIA H100 80GB", Count: 0}},
				GPUs:  []api.ClaimGPU{{PCIAddress: "0000:3b:00.0"}}}, Options{Driver: "gpus.example.com", Name: "given-name"})
		}},
		{"kubevirt-eight.yaml", func() ([]byte, error) { return KubeVirtManifests(eight, Options{Namespace: "default"}) }},
	} {
		got, err := tc.render()
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		path := filepath.Join("testdata", tc.file)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", tc.file, got, want)
		}
	}
}

// ResourceClaimName accepts a name exactly when Kubernetes would (and it
// has at most 63 bytes).
func TestResourceClaimNameAgreesWithKubernetes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		id := rapid.StringMatching(`[-a-zA-Z0-9_.]{0,70}|[a-z0-9.-]{1,64}`).Draw(t, "id")
		n := strings.ToLower(strings.ReplaceAll(id, "_", "-"))
		want := len(n) <= 63 && len(validation.IsDNS1123Subdomain(n)) == 0
		got, err := ResourceClaimName(id)
		if (err == nil) != want || err == nil && got != n {
			t.Fatalf("ResourceClaimName(%q) = %q, %v; Kubernetes accepts %q: %v", id, got, err, n, want)
		}
	})
}

func TestModelClassNames(t *testing.T) {
	for model, want := range map[string]string{
		"NVIDIA H100 80GB": "h100-80gb.gpu.gpuherd.io",
		"NVIDIA L40S":      "l40s.gpu.gpuherd.io",
		"NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000-blackwell-server-edition.gpu.gpuherd.io",
		"10de:2bb9":               "10de-2bb9.gpu.gpuherd.io",
		"NVIDIA A100 80GB (PCIe)": "a100-80gb-pcie.gpu.gpuherd.io",
	} {
		if got := ModelClass(DefaultDriverName, model); got != want {
			t.Errorf("ModelClass(%q) = %s, want %s", model, got, want)
		}
	}
}

func TestDeviceClassesSelectOnlyFreeGPUs(t *testing.T) {
	out, err := DeviceClassesYAML(DefaultDriverName, []string{"NVIDIA H100 80GB", "NVIDIA L40S", "NVIDIA L40S"})
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(out), "---\n")
	if len(docs) != 4 {
		t.Fatalf("%d classes, want 4 (any, H100, L40S, claimed):\n%s", len(docs), out)
	}
	for i, doc := range docs {
		var dc resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &dc); err != nil {
			t.Fatalf("class %d: %v\n%s", i, err, doc)
		}
		expr := dc.Spec.Selectors[0].CEL.Expression
		claimed := dc.Name == ClaimedClass(DefaultDriverName)
		if claimed != strings.Contains(expr, `.claim != ""`) || claimed == strings.Contains(expr, `.claim == ""`) {
			t.Errorf("%s selects %q", dc.Name, expr)
		}
		if !strings.HasPrefix(expr, `device.driver == "gpu.gpuherd.io"`) {
			t.Errorf("%s does not select the driver: %q", dc.Name, expr)
		}
	}
	var h100 resourceapi.DeviceClass
	if err := yaml.Unmarshal([]byte(docs[1]), &h100); err != nil || !strings.HasSuffix(h100.Spec.Selectors[0].CEL.Expression, ` && device.attributes["gpu.gpuherd.io"].model == "NVIDIA H100 80GB"`) {
		t.Errorf("the H100 class does not select the model (%v):\n%s", err, docs[1])
	}
}

func TestPinnedClaim(t *testing.T) {
	c := api.Claim{ID: "vm_7", Node: "hv-1", State: api.StateClaimed, Labels: map[string]string{api.LabelKubernetes: "true"},
		Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 2}},
		GPUs:  []api.ClaimGPU{{PCIAddress: "0000:18:00.0"}, {PCIAddress: "0000:2a:00.0"}}}
	out, err := KubeVirtManifests(c, Options{Namespace: "vms"})
	if err != nil {
		t.Fatal(err)
	}
	doc, frag, _ := strings.Cut(string(out), "---\n")
	var rc resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict([]byte(doc), &rc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rc.Name != "vm-7" || rc.Namespace != "vms" || rc.Annotations[api.AnnotationClaim] != "vm_7" || len(rc.Spec.Devices.Requests) != 2 {
		t.Fatalf("ResourceClaim %+v", rc)
	}
	for i, r := range rc.Spec.Devices.Requests {
		expr := r.Exactly.Selectors[0].CEL.Expression
		want := `device.attributes["gpu.gpuherd.io"].node == "hv-1" && device.attributes["gpu.gpuherd.io"].claim == "vm_7" && device.attributes["resource.kubernetes.io"].pciBusID == "` + c.GPUs[i].PCIAddress + `"`
		if r.Name != RequestName(i) || r.Exactly.DeviceClassName != "claimed.gpu.gpuherd.io" || expr != want {
			t.Errorf("request %d: %s %s %q", i, r.Name, r.Exactly.DeviceClassName, expr)
		}
	}
	for _, want := range []string{"# resourceClaims:", "#     resourceClaimName: vm-7", "#       - claimName: gpus", "#         requestName: gpu1"} {
		if !strings.Contains(frag, want) {
			t.Errorf("VM fragment lacks %q:\n%s", want, frag)
		}
	}

	for _, bad := range []struct {
		c    api.Claim
		want string
	}{
		{api.Claim{ID: "vm-8", State: api.StateClaimed}, "claim it with --kubernetes"},
		{api.Claim{ID: "vm-9", State: api.StateReserved, Labels: c.Labels}, "only a committed claim"},
		{api.Claim{ID: "-x", State: api.StateClaimed, Labels: c.Labels}, "give one with --name"},
	} {
		if _, err := PinnedClaim(bad.c, Options{}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("PinnedClaim(%s) = %v, want %q", bad.c.ID, err, bad.want)
		}
	}
}
