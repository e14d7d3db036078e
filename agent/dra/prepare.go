package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpuherd/gpuherd/agent/api"
)

// maxClaimID is gpuherd's longest claim ID (agent/ledger MaxIDLen).
const maxClaimID = 128

// ClaimID is the gpuherd claim ID of a ResourceClaim: "k8s.NAMESPACE.NAME."
// and the first 8 characters of its UID, so that a claim deleted and made
// again under the same name is another claim. Namespace and name are DNS
// names, which are valid in claim IDs; a pair too long for an ID is cut
// and carries the whole UID instead.
func ClaimID(namespace, name string, uid types.UID) string {
	u := string(uid)
	short := u
	if len(short) > 8 {
		short = short[:8]
	}
	id := "k8s." + namespace + "." + name + "." + short
	if len(id) <= maxClaimID {
		return id
	}
	base := "k8s." + namespace + "." + name
	return base[:maxClaimID-len(u)-1] + "." + u
}

// allocated is one device of a ResourceClaim's allocation that is this
// driver's.
type allocated struct {
	request string
	device  string
	addr    string
}

// refusal is a ResourceClaim this driver will not prepare, and why: the
// kubelet shows it on the pod's events and retries.
func refusal(c *resourceapi.ResourceClaim, format string, args ...any) error {
	return fmt.Errorf("ResourceClaim %s/%s: %s", c.Namespace, c.Name, fmt.Sprintf(format, args...))
}

// validUID reports whether uid looks like what the API server assigns
// (a UUID): it names files (the CDI spec) and the claim ID, so nothing
// else may reach a path.
func validUID(uid types.UID) bool {
	if len(uid) == 0 || len(uid) > 64 {
		return false
	}
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '-') {
			return false
		}
	}
	return true
}

// validObjectName reports whether s is a DNS subdomain, as the API server
// makes namespaces and ResourceClaim names: it goes into the claim ID.
func validObjectName(s string) bool { return len(validation.IsDNS1123Subdomain(s)) == 0 }

// ours reads the devices of c's allocation that belong to this driver,
// refusing any that is not a GPU of this node, and a claim whose identity
// is not what the API server writes.
func (d *Driver) ours(c *resourceapi.ResourceClaim) ([]allocated, error) {
	if !validUID(c.UID) || !validObjectName(c.Namespace) || !validObjectName(c.Name) {
		return nil, fmt.Errorf("ResourceClaim %.80q/%.80q (UID %.80q): not a namespace, name and UID the API server makes; refused", c.Namespace, c.Name, c.UID)
	}
	if c.Status.Allocation == nil {
		return nil, refusal(c, "is not allocated")
	}
	var out []allocated
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		if r.Pool != d.cfg.NodeName {
			return nil, refusal(c, "device %s of pool %s belongs to another node than %s: the allocation is not for this node", r.Device, r.Pool, d.cfg.NodeName)
		}
		addr, ok := PCIAddress(r.Device)
		if !ok {
			return nil, refusal(c, "device %q is not a gpuherd device (names look like gpu-0000-3b-00-0)", r.Device)
		}
		if r.ShareID != nil || len(r.ConsumedCapacity) > 0 {
			return nil, refusal(c, "device %s is allocated as a share: gpuherd hands out whole GPUs only", r.Device)
		}
		for _, o := range out {
			if o.addr == addr {
				return nil, refusal(c, "device %s is allocated twice (requests %s and %s): a GPU goes to one request", r.Device, o.request, r.Request)
			}
		}
		out = append(out, allocated{request: r.Request, device: r.Device, addr: addr})
	}
	return out, nil
}

// PrepareResourceClaims claims each ResourceClaim's GPUs in gpuherd's
// ledger, bound to vfio-pci, and hands them over as CDI devices with their
// device metadata (kubeletplugin.DRAPlugin). Idempotent: a retry finds the
// claim made and answers the same.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.work.Lock()
	defer d.work.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devs, err := d.prepare(ctx, c)
		if err != nil {
			d.log.Warn("ResourceClaim not prepared", "namespace", c.Namespace, "name", c.Name, "uid", c.UID, "err", err)
			d.rec.Prepared("refused")
		} else {
			d.rec.Prepared("prepared")
		}
		out[c.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devs}
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	allocs, err := d.ours(c)
	if err != nil || len(allocs) == 0 {
		return nil, err
	}
	st, err := d.agent.Status(ctx)
	if err != nil {
		return nil, refusal(c, "the gpuherd agent did not answer (%v); the kubelet retries", err)
	}
	addrs, gpus, err := d.addresses(c, st, allocs)
	if err != nil {
		return nil, err
	}

	uid := string(c.UID)
	var claim api.Claim
	if first := c.Annotations[api.AnnotationClaim]; first != "" {
		claim, err = d.prepareFirst(ctx, c, first, addrs, gpus)
	} else {
		claim, err = d.prepareNew(ctx, c, addrs, gpus, true)
	}
	if err != nil {
		return nil, err
	}
	held := map[string]api.ClaimGPU{}
	for _, g := range claim.GPUs {
		held[g.PCIAddress] = g
	}
	var handed []api.ClaimGPU
	for _, a := range addrs {
		g, ok := held[a]
		if !ok {
			return nil, refusal(c, "gpuherd claim %s does not hold %s", claim.ID, a)
		}
		handed = append(handed, g)
	}
	if err := d.writeCDISpec(uid, handed); err != nil {
		return nil, refusal(c, "writing its CDI spec: %v", err)
	}
	devs := make([]kubeletplugin.Device, 0, len(allocs))
	for _, a := range allocs {
		meta := map[string]resourceapi.DeviceAttribute{}
		for k, v := range attributes(gpus[a.addr], st.Node, claim.ID, d.cfg.DriverName) {
			meta[string(k)] = v
		}
		devs = append(devs, kubeletplugin.Device{
			Requests:     []string{a.request},
			PoolName:     d.cfg.NodeName,
			DeviceName:   a.device,
			CDIDeviceIDs: []string{d.cdiID(uid, a.device)},
			Metadata:     &kubeletplugin.DeviceMetadata{Attributes: meta},
		})
	}
	d.log.Info("ResourceClaim prepared", "namespace", c.Namespace, "name", c.Name, "uid", uid, "claim", claim.ID, "gpus", addrs)
	return devs, nil
}

// addresses are the PCI addresses of a claim's allocated devices, sorted,
// each a GPU of this server, with the server's GPUs by address.
func (d *Driver) addresses(c *resourceapi.ResourceClaim, st api.Status, allocs []allocated) ([]string, map[string]api.GPU, error) {
	gpus := map[string]api.GPU{}
	for _, g := range st.GPUs {
		gpus[g.PCIAddress] = g
	}
	addrs := make([]string, 0, len(allocs))
	for _, a := range allocs {
		if _, ok := gpus[a.addr]; !ok {
			return nil, nil, refusal(c, "device %s: %s has no GPU at %s (see `gpuherd status`)", a.device, st.Node, a.addr)
		}
		addrs = append(addrs, a.addr)
	}
	slices.Sort(addrs)
	return addrs, gpus, nil
}

// prepareNew makes the gpuherd claim of a ResourceClaim the scheduler
// allocated from the generic pool: exactly its devices, under the ID
// derived from it. prepared says whether the kubelet asked (or the
// allocation watcher, ahead of it).
func (d *Driver) prepareNew(ctx context.Context, c *resourceapi.ResourceClaim, addrs []string, gpus map[string]api.GPU, isPrepared bool) (api.Claim, error) {
	id := ClaimID(c.Namespace, c.Name, c.UID)
	var taken []string
	for _, a := range addrs {
		if h := gpus[a].Claim; h != "" && h != id {
			taken = append(taken, fmt.Sprintf("%s (held by gpuherd claim %s)", a, h))
		}
	}
	if len(taken) > 0 {
		return api.Claim{}, refusal(c, "The following GPUs are not available: %s; the allocation is stale: delete the pod so that the scheduler allocates other GPUs", strings.Join(taken, ", "))
	}
	if err := d.state.put(string(c.UID), prepared{Namespace: c.Namespace, Name: c.Name, Claim: id, Devices: addrs, Prepared: isPrepared}); err != nil {
		return api.Claim{}, refusal(c, "%v", err)
	}
	claim, err := d.agent.Claim(ctx, id, api.ClaimRequest{
		Devices: addrs,
		Labels: map[string]string{
			api.LabelResourceClaim:    c.Namespace + "/" + c.Name,
			api.LabelResourceClaimUID: string(c.UID),
		},
	})
	var ae *api.Error
	switch {
	case errors.As(err, &ae) && ae.Code == api.CodeConflict:
		return api.Claim{}, refusal(c, "gpuherd claim %s of this ResourceClaim holds other GPUs than its allocation (%s): %s", id, strings.Join(addrs, ", "), ae.Message)
	case err != nil:
		return api.Claim{}, refusal(c, "claiming %s as gpuherd claim %s: %v", strings.Join(addrs, ", "), id, err)
	}
	return claim, nil
}

// prepareFirst checks a ResourceClaim pinned to a gpuherd claim made first
// (the platform claimed, then created the VM's ResourceClaims): its
// allocation must be that claim's GPUs, which then are marked in use by
// the pod.
func (d *Driver) prepareFirst(ctx context.Context, c *resourceapi.ResourceClaim, id string, addrs []string, gpus map[string]api.GPU) (api.Claim, error) {
	for _, a := range addrs {
		if h := gpus[a].Claim; h != id {
			why := "free"
			if h != "" {
				why = "held by gpuherd claim " + h
			}
			return api.Claim{}, refusal(c, "is pinned to gpuherd claim %s (annotation %s), but its device %s is %s, not %s's: create the ResourceClaim from `gpuherd get %s -o kubevirt`", id, api.AnnotationClaim, DeviceName(a), why, id, id)
		}
	}
	domain := podOf(c)
	if err := d.state.put(string(c.UID), prepared{Namespace: c.Namespace, Name: c.Name, Claim: id, First: true, Domain: domain, Devices: addrs, Prepared: true}); err != nil {
		return api.Claim{}, refusal(c, "%v", err)
	}
	var fns []string
	for _, a := range addrs {
		fns = append(fns, a)
		fns = append(fns, gpus[a].Companions...)
	}
	claim, err := d.agent.UseClaim(ctx, id, api.UseRequest{DomainUUID: domain, DomainName: "pod " + c.Namespace + "/" + podName(c), PCIAddresses: fns})
	if err != nil {
		return api.Claim{}, refusal(c, "handing gpuherd claim %s to its pod: %v", id, err)
	}
	return claim, nil
}

// podOf is the UID of the pod a ResourceClaim is reserved for, which marks
// the gpuherd claim's use: a VM's several ResourceClaims share it. The
// claim's own UID when no pod is named.
func podOf(c *resourceapi.ResourceClaim) string {
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" && r.UID != "" {
			return string(r.UID)
		}
	}
	return string(c.UID)
}

func podName(c *resourceapi.ResourceClaim) string {
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" {
			return r.Name
		}
	}
	return c.Name
}

// UnprepareResourceClaims frees what prepare took (kubeletplugin.DRAPlugin):
// a claim made for a ResourceClaim is released, remembered on this server
// like any release, once no VM holds its VFIO groups open; a claim made
// first only stops being used by the pod. Idempotent: an unknown claim is
// already unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.work.Lock()
	defer d.work.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := d.unprepare(ctx, c)
		if err != nil {
			d.log.Warn("ResourceClaim not unprepared", "namespace", c.Namespace, "name", c.Name, "uid", c.UID, "err", err)
			d.rec.Unprepared("refused")
		} else {
			d.rec.Unprepared("unprepared")
		}
		out[c.UID] = err
	}
	return out, nil
}

func (d *Driver) unprepare(ctx context.Context, c kubeletplugin.NamespacedObject) error {
	if !validUID(c.UID) || !validObjectName(c.Namespace) || !validObjectName(c.Name) {
		return fmt.Errorf("ResourceClaim %.80q/%.80q (UID %.80q): not a namespace, name and UID the API server makes; nothing to unprepare", c.Namespace, c.Name, c.UID)
	}
	uid := string(c.UID)
	p, ok := d.state.get(uid)
	if !ok {
		p = prepared{Namespace: c.Namespace, Name: c.Name, Claim: ClaimID(c.Namespace, c.Name, c.UID)}
	}
	what := fmt.Sprintf("ResourceClaim %s/%s", c.Namespace, c.Name)
	if p.First {
		if _, err := d.agent.EndUse(ctx, p.Claim, p.Domain, false); err != nil && !api.IsCode(err, api.CodeNotFound) {
			return fmt.Errorf("%s: ending its pod's use of gpuherd claim %s: %w", what, p.Claim, err)
		}
		if err := d.removeCDISpec(uid); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err := d.state.remove(uid); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	} else if err := d.release(ctx, uid, p); err != nil {
		if api.IsCode(err, api.CodeInUse) {
			return fmt.Errorf("%s: its GPUs are still in use, the VM's QEMU holds their VFIO groups open (%w); the kubelet retries once it exits", what, err)
		}
		return fmt.Errorf("%s: releasing gpuherd claim %s: %w", what, p.Claim, err)
	}
	d.log.Info("ResourceClaim unprepared", "namespace", c.Namespace, "name", c.Name, "uid", uid, "claim", p.Claim)
	return nil
}
