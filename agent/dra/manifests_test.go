package dra

import (
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

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
	out, err := KubeVirtManifests(c, ManifestOptions{Namespace: "vms"})
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
		if _, err := PinnedClaim(bad.c, ManifestOptions{}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("PinnedClaim(%s) = %v, want %q", bad.c.ID, err, bad.want)
		}
	}
}
