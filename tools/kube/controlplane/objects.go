package controlplane

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// PodClaim is one entry of a pod's spec.resourceClaims, as KubeVirt's
// virt-launcher pod carries one per VMI spec.resourceClaims entry.
type PodClaim struct {
	// Name is the pod-level claim name (pod.spec.resourceClaims[].name).
	Name string
	// ResourceClaimName names an existing ResourceClaim; set this or
	// ResourceClaimTemplateName.
	ResourceClaimName string
	// ResourceClaimTemplateName names a ResourceClaimTemplate from which
	// the ResourceClaim controller creates a claim for the pod.
	ResourceClaimTemplateName string
	// Requests are the claim's requests the compute container uses, one
	// resources.claims entry each; none means one entry for the whole claim.
	Requests []string
}

// LauncherPod builds a pod shaped like KubeVirt's virt-launcher: the
// kubevirt.io=virt-launcher label, spec.resourceClaims from claims, and a
// "compute" container whose resources.claims reference them. The pod has no
// node; the scheduler picks one.
func LauncherPod(namespace, name string, claims ...PodClaim) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      name,
			Labels:    map[string]string{"kubevirt.io": "virt-launcher"},
		},
		Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{
				Name:  "compute",
				Image: "quay.io/kubevirt/virt-launcher:v1.9.0",
				Resources: v1.ResourceRequirements{
					Requests: v1.ResourceList{
						v1.ResourceCPU:    resource.MustParse("100m"),
						v1.ResourceMemory: resource.MustParse("64Mi"),
					},
				},
			}},
		},
	}
	compute := &pod.Spec.Containers[0]
	for _, c := range claims {
		pc := v1.PodResourceClaim{Name: c.Name}
		if c.ResourceClaimName != "" {
			pc.ResourceClaimName = ptr.To(c.ResourceClaimName)
		}
		if c.ResourceClaimTemplateName != "" {
			pc.ResourceClaimTemplateName = ptr.To(c.ResourceClaimTemplateName)
		}
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, pc)
		if len(c.Requests) == 0 {
			compute.Resources.Claims = append(compute.Resources.Claims, v1.ResourceClaim{Name: c.Name})
		}
		for _, r := range c.Requests {
			compute.Resources.Claims = append(compute.Resources.Claims, v1.ResourceClaim{Name: c.Name, Request: r})
		}
	}
	return pod
}

// DeviceRequest asks for exactly one device of DeviceClassName, optionally
// narrowed by a CEL Selector (e.g. `device.attributes["gpu.gpuherd.io"].model == "H100"`).
// One device per request is what KubeVirt accepts.
type DeviceRequest struct {
	Name            string
	DeviceClassName string
	Selector        string
}

// Requests returns n DeviceRequests named prefix0 … prefix(n-1), all of
// class and selector (which may be empty).
func Requests(prefix, class string, n int, selector string) []DeviceRequest {
	out := make([]DeviceRequest, n)
	for i := range out {
		out[i] = DeviceRequest{Name: fmt.Sprintf("%s%d", prefix, i), DeviceClassName: class, Selector: selector}
	}
	return out
}

func claimSpec(requests []DeviceRequest) resourceapi.ResourceClaimSpec {
	var spec resourceapi.ResourceClaimSpec
	for _, r := range requests {
		exact := &resourceapi.ExactDeviceRequest{
			DeviceClassName: r.DeviceClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           1,
		}
		if r.Selector != "" {
			exact.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: r.Selector}}}
		}
		spec.Devices.Requests = append(spec.Devices.Requests, resourceapi.DeviceRequest{Name: r.Name, Exactly: exact})
	}
	return spec
}

// Claim builds a ResourceClaim with one request per entry of requests.
func Claim(namespace, name string, requests ...DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       claimSpec(requests),
	}
}

// ClaimTemplate builds a ResourceClaimTemplate whose claims have one request
// per entry of requests.
func ClaimTemplate(namespace, name string, requests ...DeviceRequest) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: claimSpec(requests)},
	}
}

// DeviceClass builds a DeviceClass whose devices must pass the CEL
// selector, e.g. `device.driver == "gpu.gpuherd.io"`.
func DeviceClass(name, selector string) *resourceapi.DeviceClass {
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if selector != "" {
		class.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
	}
	return class
}

// Device builds a slice device with the given attributes; values may be
// string, bool, int, int64 or a resourceapi.DeviceAttribute. Keys are
// attribute names as in a ResourceSlice: "model" belongs to the driver's
// domain, "resource.kubernetes.io/pciBusID" is fully qualified.
func Device(name string, attributes map[string]any) resourceapi.Device {
	d := resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
	for k, v := range attributes {
		var a resourceapi.DeviceAttribute
		switch v := v.(type) {
		case string:
			a.StringValue = ptr.To(v)
		case bool:
			a.BoolValue = ptr.To(v)
		case int:
			a.IntValue = ptr.To(int64(v))
		case int64:
			a.IntValue = ptr.To(v)
		case resourceapi.DeviceAttribute:
			a = v
		default:
			panic(fmt.Sprintf("controlplane.Device: attribute %s has unsupported type %T", k, v))
		}
		d.Attributes[resourceapi.QualifiedName(k)] = a
	}
	return d
}

// NodeSlice builds the ResourceSlice a DRA driver would publish for node:
// one pool named after the node, generation 1, all devices in one slice.
// Tests without a real plugin create it to stand in for one.
func NodeSlice(driver, node string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driverSliceSuffix(driver)},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  devices,
		},
	}
}

// driverSliceSuffix makes a driver name usable inside an object name.
func driverSliceSuffix(driver string) string {
	b := []byte(driver)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	return string(b)
}
