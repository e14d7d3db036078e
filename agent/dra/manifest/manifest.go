// Package manifest writes the Kubernetes manifests of gpuherd's DRA driver:
// its DeviceClasses (`gpuherd kubernetes deviceclasses`) and the pinned
// ResourceClaim of a claim made first for a KubeVirt VM (`gpuherd get ID
// -o kubevirt`). It imports nothing of Kubernetes: the objects are plain
// structs with the field names of resource.k8s.io/v1, so that the gpuherd
// binary does not link client-go and its API types, whose package
// initialisation alone costs every agent tens of MiB of resident memory
// (docs/design.md, "The kubelet plugin's own binary"). The driver itself,
// agent/dra, uses the names and attributes defined here.
package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"go.yaml.in/yaml/v3"
)

// DefaultDriverName is the driver name, and the attribute domain, unless
// configured otherwise.
const DefaultDriverName = "gpu.gpuherd.io"

// gpuherd's own device attributes, in the driver's domain, that the
// DeviceClasses and pinned ResourceClaims select on (agent/dra publishes
// them).
const (
	AttrModel = "model"
	AttrNode  = "node"
	AttrClaim = "claim"
)

// The objects, as far as gpuherd fills them in: resource.k8s.io/v1's
// DeviceClass and ResourceClaim with their JSON field names.
type (
	// TypeMeta is metav1.TypeMeta.
	TypeMeta struct {
		APIVersion string `json:"apiVersion,omitempty"`
		Kind       string `json:"kind,omitempty"`
	}
	// ObjectMeta is the part of metav1.ObjectMeta gpuherd sets.
	ObjectMeta struct {
		Name        string            `json:"name,omitempty"`
		Namespace   string            `json:"namespace,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	// DeviceClass is resourceapi.DeviceClass.
	DeviceClass struct {
		TypeMeta   `json:",inline"`
		ObjectMeta `json:"metadata,omitempty"`
		Spec       DeviceClassSpec `json:"spec"`
	}
	// DeviceClassSpec is resourceapi.DeviceClassSpec.
	DeviceClassSpec struct {
		Selectors []DeviceSelector `json:"selectors,omitempty"`
	}
	// DeviceSelector is resourceapi.DeviceSelector.
	DeviceSelector struct {
		CEL *CELDeviceSelector `json:"cel,omitempty"`
	}
	// CELDeviceSelector is resourceapi.CELDeviceSelector.
	CELDeviceSelector struct {
		Expression string `json:"expression"`
	}
	// ResourceClaim is resourceapi.ResourceClaim, without a status.
	ResourceClaim struct {
		TypeMeta   `json:",inline"`
		ObjectMeta `json:"metadata,omitempty"`
		Spec       ResourceClaimSpec `json:"spec"`
	}
	// ResourceClaimSpec is resourceapi.ResourceClaimSpec.
	ResourceClaimSpec struct {
		Devices DeviceClaim `json:"devices"`
	}
	// DeviceClaim is resourceapi.DeviceClaim.
	DeviceClaim struct {
		Requests []DeviceRequest `json:"requests"`
	}
	// DeviceRequest is resourceapi.DeviceRequest.
	DeviceRequest struct {
		Name    string              `json:"name"`
		Exactly *ExactDeviceRequest `json:"exactly,omitempty"`
	}
	// ExactDeviceRequest is resourceapi.ExactDeviceRequest.
	ExactDeviceRequest struct {
		DeviceClassName string           `json:"deviceClassName"`
		Selectors       []DeviceSelector `json:"selectors,omitempty"`
	}
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

func selectors(expr string) []DeviceSelector {
	return []DeviceSelector{{CEL: &CELDeviceSelector{Expression: expr}}}
}

// DeviceClasses are the classes of this driver: any free GPU (named as
// the driver), the free GPUs of each model, and the claimed ones.
func DeviceClasses(driver string, models []string) []DeviceClass {
	free := fmt.Sprintf("device.driver == %s && %s == \"\"", celString(driver), attrRef(driver, AttrClaim))
	class := func(name, expr, what string) DeviceClass {
		return DeviceClass{
			TypeMeta: TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
			ObjectMeta: ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "gpuherd"},
				Annotations: map[string]string{"gpuherd.io/description": what}},
			Spec: DeviceClassSpec{Selectors: selectors(expr)},
		}
	}
	out := []DeviceClass{class(driver, free, "any free GPU, passed through whole")}
	seen := map[string]bool{driver: true}
	for _, m := range models {
		name := ModelClass(driver, m)
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, class(name, free+" && "+attrRef(driver, AttrModel)+" == "+celString(m), "a free "+m+", passed through whole"))
	}
	out = append(out, class(ClaimedClass(driver),
		fmt.Sprintf("device.driver == %s && %s != \"\"", celString(driver), attrRef(driver, AttrClaim)),
		"GPUs of a gpuherd claim made first: for the ResourceClaims of `gpuherd get ID -o kubevirt`"))
	return out
}

// Options shape a claim's Kubernetes manifests.
type Options struct {
	Driver    string // the driver name; DefaultDriverName when empty
	Namespace string // the VM's namespace
	// Name is the ResourceClaim's name; the claim ID made a DNS name when
	// empty.
	Name string
}

// dns1123Subdomain is what Kubernetes accepts as an object's name
// (k8s.io/apimachinery's validation.IsDNS1123Subdomain, whose length
// limit of 253 ResourceClaimName lowers to 63).
var dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// ResourceClaimName makes a claim ID the name of its ResourceClaim, or
// says why it cannot be one.
func ResourceClaimName(id string) (string, error) {
	n := strings.ToLower(strings.ReplaceAll(id, "_", "-"))
	if len(n) > 63 || !dns1123Subdomain.MatchString(n) {
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
func PinnedClaim(c api.Claim, o Options) (ResourceClaim, error) {
	if o.Driver == "" {
		o.Driver = DefaultDriverName
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if c.State != api.StateClaimed {
		return ResourceClaim{}, fmt.Errorf("claim %s is %s: only a committed claim is handed to Kubernetes", c.ID, c.State)
	}
	if _, ok := c.Labels[api.LabelKubernetes]; !ok {
		return ResourceClaim{}, fmt.Errorf("claim %s is not for Kubernetes: its GPUs are not published to it; claim it with --kubernetes (label %s)", c.ID, api.LabelKubernetes)
	}
	name := o.Name
	if name == "" {
		var err error
		if name, err = ResourceClaimName(c.ID); err != nil {
			return ResourceClaim{}, err
		}
	}
	rc := ResourceClaim{
		TypeMeta: TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: ObjectMeta{Name: name, Namespace: o.Namespace,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "gpuherd"},
			Annotations: map[string]string{api.AnnotationClaim: c.ID, "gpuherd.io/node": c.Node}},
	}
	for i, g := range c.GPUs {
		expr := fmt.Sprintf("%s == %s && %s == %s && device.attributes[\"resource.kubernetes.io\"].pciBusID == %s",
			attrRef(o.Driver, AttrNode), celString(c.Node), attrRef(o.Driver, AttrClaim), celString(c.ID), celString(g.PCIAddress))
		rc.Spec.Devices.Requests = append(rc.Spec.Devices.Requests, DeviceRequest{
			Name:    RequestName(i),
			Exactly: &ExactDeviceRequest{DeviceClassName: ClaimedClass(o.Driver), Selectors: selectors(expr)},
		})
	}
	return rc, nil
}

// RequestName is the name of a pinned claim's request for its i-th GPU.
func RequestName(i int) string { return fmt.Sprintf("gpu%d", i) }

// KubeVirtManifests writes a claim's ResourceClaim and, as a comment-led
// fragment, what goes into the VirtualMachine's spec.template.spec.
func KubeVirtManifests(c api.Claim, o Options) ([]byte, error) {
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
	b.Write(out)
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
		b.Write(out)
	}
	return b.Bytes(), nil
}

// toYAML writes v as Kubernetes reads it (its JSON field names, keys in
// order), without folding long lines: a CEL expression stays on one line.
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
