package dra

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"go.yaml.in/yaml/v3"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ClaimedClass names the DeviceClass of GPUs held by gpuherd claims made
// for Kubernetes: only ResourceClaims pinned to one claim (`gpuherd get ID
// -o kubevirt`) use it. The generic classes select free GPUs only, so a
// plain ResourceClaim never gets a GPU gpuherd gave to someone else.
func ClaimedClass(driver string) string { return "claimed." + driver }

// ModelClass names the DeviceClass of free GPUs of one model:
// "h100-80gb.gpu.gpuherd.io" for "NVIDIA H100 80GB".
func ModelClass(driver, model string) string { return slug(model) + "." + driver }

// slug makes a model's name a DNS label: lower case, words joined by '-',
// the vendor's name left out.
func slug(model string) string {
	m := strings.ToLower(strings.TrimSpace(model))
	m = strings.TrimPrefix(m, "nvidia ")
	var b strings.Builder
	dash := false
	for _, r := range m {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	s := strings.TrimSuffix(b.String(), "-")
	if len(s) > 40 {
		s = strings.TrimSuffix(s[:40], "-")
	}
	if s == "" {
		s = "gpu"
	}
	return s
}

// celString quotes s as a CEL string literal.
func celString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

func attrRef(driver, name string) string {
	return fmt.Sprintf("device.attributes[%s].%s", celString(driver), name)
}

// DeviceClasses are the classes of this driver: any free GPU (named as
// the driver), the free GPUs of each model, and the claimed ones.
func DeviceClasses(driver string, models []string) []resourceapi.DeviceClass {
	free := fmt.Sprintf("device.driver == %s && %s == \"\"", celString(driver), attrRef(driver, attrClaim))
	class := func(name, expr, what string) resourceapi.DeviceClass {
		return resourceapi.DeviceClass{
			TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "gpuherd"},
				Annotations: map[string]string{"gpuherd.io/description": what}},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}},
		}
	}
	out := []resourceapi.DeviceClass{class(driver, free, "any free GPU, passed through whole")}
	seen := map[string]bool{driver: true}
	for _, m := range models {
		name := ModelClass(driver, m)
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, class(name, free+" && "+attrRef(driver, attrModel)+" == "+celString(m), "a free "+m+", passed through whole"))
	}
	out = append(out, class(ClaimedClass(driver),
		fmt.Sprintf("device.driver == %s && %s != \"\"", celString(driver), attrRef(driver, attrClaim)),
		"GPUs of a gpuherd claim made first: for the ResourceClaims of `gpuherd get ID -o kubevirt`"))
	return out
}

// ManifestOptions shape a claim's Kubernetes manifests.
type ManifestOptions struct {
	Driver    string // the driver name; DefaultDriverName when empty
	Namespace string // the VM's namespace
	// Name is the ResourceClaim's name; the claim ID made a DNS name when
	// empty.
	Name string
}

// ResourceClaimName makes a claim ID the name of its ResourceClaim, or
// says why it cannot be one.
func ResourceClaimName(id string) (string, error) {
	n := strings.ToLower(strings.ReplaceAll(id, "_", "-"))
	if len(n) > 63 || len(validation.IsDNS1123Subdomain(n)) > 0 {
		return "", fmt.Errorf("claim %s does not make a Kubernetes name (lower case, digits, '-' and '.', at most 63, starting and ending alphanumeric): give one with --name", id)
	}
	return n, nil
}

// PinnedClaim is the ResourceClaim of a gpuherd claim made first for a
// KubeVirt VM: one request per GPU (KubeVirt takes one device per
// request), each pinned by CEL to that GPU of that claim, so the
// scheduler allocates exactly gpuherd's choice and puts the VM's launcher
// pod on gpuherd's server. Prepare then checks the allocation against the
// claim (annotation gpuherd.io/claim).
func PinnedClaim(c api.Claim, o ManifestOptions) (resourceapi.ResourceClaim, error) {
	if o.Driver == "" {
		o.Driver = DefaultDriverName
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if c.State != api.StateClaimed {
		return resourceapi.ResourceClaim{}, fmt.Errorf("claim %s is %s: only a committed claim is handed to Kubernetes", c.ID, c.State)
	}
	if _, ok := c.Labels[api.LabelKubernetes]; !ok {
		return resourceapi.ResourceClaim{}, fmt.Errorf("claim %s is not for Kubernetes: its GPUs are not published to it; claim it with --kubernetes (label %s)", c.ID, api.LabelKubernetes)
	}
	name := o.Name
	if name == "" {
		var err error
		if name, err = ResourceClaimName(c.ID); err != nil {
			return resourceapi.ResourceClaim{}, err
		}
	}
	rc := resourceapi.ResourceClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "gpuherd"},
			Annotations: map[string]string{api.AnnotationClaim: c.ID, "gpuherd.io/node": c.Node}},
	}
	for i, g := range c.GPUs {
		expr := fmt.Sprintf("%s == %s && %s == %s && device.attributes[\"resource.kubernetes.io\"].pciBusID == %s",
			attrRef(o.Driver, attrNode), celString(c.Node), attrRef(o.Driver, attrClaim), celString(c.ID), celString(g.PCIAddress))
		rc.Spec.Devices.Requests = append(rc.Spec.Devices.Requests, resourceapi.DeviceRequest{
			Name: RequestName(i),
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: ClaimedClass(o.Driver),
				Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}},
			},
		})
	}
	return rc, nil
}

// RequestName is the name of a pinned claim's request for its i-th GPU.
func RequestName(i int) string { return fmt.Sprintf("gpu%d", i) }

// KubeVirtManifests writes a claim's ResourceClaim and, as a comment-led
// fragment, what goes into the VirtualMachine's spec.template.spec.
func KubeVirtManifests(c api.Claim, o ManifestOptions) ([]byte, error) {
	rc, err := PinnedClaim(c, o)
	if err != nil {
		return nil, err
	}
	out, err := toYAML(rc)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# gpuherd claim %s on %s: %s\n", c.ID, c.Node, api.DescribeItems(c.Items))
	b.Write(cleanYAML(out))
	fmt.Fprintf(&b, "---\n# In the VirtualMachine's spec.template.spec (KubeVirt, DRA GPUs):\n")
	type gpu struct {
		Name        string `json:"name"`
		ClaimName   string `json:"claimName"`
		RequestName string `json:"requestName"`
	}
	type podClaim struct {
		Name              string `json:"name"`
		ResourceClaimName string `json:"resourceClaimName"`
	}
	var frag struct {
		ResourceClaims []podClaim `json:"resourceClaims"`
		Domain         struct {
			Devices struct {
				GPUs []gpu `json:"gpus"`
			} `json:"devices"`
		} `json:"domain"`
	}
	frag.ResourceClaims = []podClaim{{Name: "gpus", ResourceClaimName: rc.Name}}
	for i := range c.GPUs {
		frag.Domain.Devices.GPUs = append(frag.Domain.Devices.GPUs, gpu{Name: RequestName(i), ClaimName: "gpus", RequestName: RequestName(i)})
	}
	fy, err := toYAML(frag)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.SplitAfter(strings.TrimRight(string(fy), "\n"), "\n") {
		b.WriteString("# " + strings.TrimRight(line, "\n") + "\n")
	}
	return b.Bytes(), nil
}

// DeviceClassesYAML writes the classes as one YAML stream.
func DeviceClassesYAML(driver string, models []string) ([]byte, error) {
	var b bytes.Buffer
	for i, dc := range DeviceClasses(driver, models) {
		out, err := toYAML(dc)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(cleanYAML(out))
	}
	return b.Bytes(), nil
}

// toYAML writes v as Kubernetes reads it (its JSON field names), without
// folding long lines: a CEL expression stays on one line.
func toYAML(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal(j, &doc); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// cleanYAML drops the empty fields Kubernetes types always marshal.
func cleanYAML(out []byte) []byte {
	var keep []string
	for _, line := range strings.SplitAfter(string(out), "\n") {
		t := strings.TrimSpace(line)
		if t == "creationTimestamp: null" || t == "status: {}" {
			continue
		}
		keep = append(keep, line)
	}
	return []byte(strings.Join(keep, ""))
}
