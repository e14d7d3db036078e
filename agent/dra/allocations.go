package dra

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The allocation watcher takes a GPU into gpuherd's ledger as soon as the
// scheduler allocates it, not only when the kubelet prepares the pod: in
// between (image pulls, a busy kubelet) a libvirt VM could otherwise claim
// the GPU, and the pod would find its allocation stale. A claim adopted
// this way and deallocated before any prepare (the pod deleted while
// pending) is released again. Prepare and unprepare stay the authority:
// the watcher only moves the claim earlier, and a watcher that cannot run
// (the kubelet's credentials may not list ResourceClaims) leaves claiming
// to prepare, as before.

// watchAllocations starts the watcher; it logs and returns when this
// plugin may not list ResourceClaims.
func (d *Driver) watchAllocations(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := d.cfg.KubeClient.ResourceV1().ResourceClaims("").List(lctx, metav1.ListOptions{Limit: 1})
	cancel()
	if err != nil {
		if apierrors.IsForbidden(err) {
			d.log.Warn("this plugin may not list ResourceClaims: a GPU is taken into gpuherd's ledger at prepare only, not at allocation; give its credentials list and watch on resourceclaims (docs/kubevirt.md)", "err", err)
		} else {
			d.log.Warn("ResourceClaims cannot be listed now; a GPU is taken into gpuherd's ledger at prepare only", "err", err)
		}
		return
	}
	inf := resourceinformers.NewResourceClaimInformer(d.cfg.KubeClient, "", 10*time.Minute, cache.Indexers{})
	queue := make(chan *resourceapi.ResourceClaim, 256)
	gone := make(chan types.UID, 256)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { d.seen(queue, gone, obj) },
		UpdateFunc: func(_, obj any) { d.seen(queue, gone, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				send(ctx, gone, c.UID)
			}
		},
	})
	go inf.Run(ctx.Done())
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return
		}
		d.dropVanished(ctx, inf.GetStore())
		close(d.watching)
	}()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case c := <-queue:
				d.adopt(ctx, c)
			case uid := <-gone:
				d.drop(ctx, string(uid))
			}
		}
	}()
}

func send[T any](ctx context.Context, ch chan<- T, v T) {
	select {
	case ch <- v:
	case <-ctx.Done():
	}
}

// seen sorts a ResourceClaim the watcher saw: allocated on this node to
// this driver, it is adopted; not (or no longer) allocated, what was
// adopted for it and never prepared is dropped.
func (d *Driver) seen(queue chan<- *resourceapi.ResourceClaim, gone chan<- types.UID, obj any) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	ctx := d.ctx
	if c.Status.Allocation == nil {
		if _, had := d.state.get(string(c.UID)); had {
			send(ctx, gone, c.UID)
		}
		return
	}
	if _, ok := c.Annotations[api.AnnotationClaim]; ok {
		return // claimed first: its GPUs are claimed already
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == d.cfg.DriverName && r.Pool == d.cfg.NodeName {
			send(ctx, queue, c.DeepCopy())
			return
		}
	}
}

// adopt takes an allocated ResourceClaim's GPUs into the ledger now.
func (d *Driver) adopt(ctx context.Context, c *resourceapi.ResourceClaim) {
	d.work.Lock()
	defer d.work.Unlock()
	if _, had := d.state.get(string(c.UID)); had {
		return
	}
	allocs, err := d.ours(c)
	if err != nil || len(allocs) == 0 {
		return
	}
	st, err := d.agent.Status(ctx)
	if err != nil {
		d.log.Warn("allocation not taken into the ledger yet: the agent does not answer; prepare will", "namespace", c.Namespace, "name", c.Name, "err", err)
		return
	}
	addrs, gpus, err := d.addresses(c, st, allocs)
	if err != nil {
		d.log.Warn("allocation not taken into the ledger", "err", err)
		return
	}
	if _, err := d.prepareNew(ctx, c, addrs, gpus, false); err != nil {
		d.log.Warn("allocation not taken into the ledger; its prepare will be refused the same way", "err", err)
		return
	}
	d.log.Info("allocation taken into the ledger before its prepare", "namespace", c.Namespace, "name", c.Name, "uid", c.UID, "claim", ClaimID(c.Namespace, c.Name, c.UID), "gpus", addrs)
}

// drop releases what was adopted for a ResourceClaim that went away
// without a prepare; a prepared one is the kubelet's to unprepare.
func (d *Driver) drop(ctx context.Context, uid string) {
	d.work.Lock()
	defer d.work.Unlock()
	p, ok := d.state.get(uid)
	if !ok || p.Prepared || p.First {
		return
	}
	if err := d.release(ctx, uid, p); err != nil {
		d.log.Warn("an allocation gone before its prepare is not released yet", "namespace", p.Namespace, "name", p.Name, "err", err)
		return
	}
	d.log.Info("allocation gone before its prepare; released", "namespace", p.Namespace, "name", p.Name, "claim", p.Claim)
}

// dropVanished releases, once the watcher has caught up, what was adopted
// for ResourceClaims deallocated or deleted while the plugin was down.
func (d *Driver) dropVanished(ctx context.Context, store cache.Store) {
	allocated := map[string]bool{}
	for _, obj := range store.List() {
		if c, ok := obj.(*resourceapi.ResourceClaim); ok && c.Status.Allocation != nil {
			allocated[string(c.UID)] = true
		}
	}
	for _, uid := range d.state.uids() {
		if !allocated[uid] {
			d.drop(ctx, uid)
		}
	}
}

// release frees the claim made for a ResourceClaim, when it is still the
// one made for it, and forgets the ResourceClaim.
func (d *Driver) release(ctx context.Context, uid string, p prepared) error {
	held, err := d.agent.Get(ctx, p.Claim)
	switch {
	case api.IsCode(err, api.CodeNotFound):
	case err != nil:
		return fmt.Errorf("looking up gpuherd claim %s: %w", p.Claim, err)
	case held.Labels[api.LabelResourceClaimUID] != uid:
		d.log.Warn("gpuherd claim of a ResourceClaim's name was not made for it; left alone", "claim", p.Claim, "uid", uid)
	default:
		if _, err := d.agent.Release(ctx, p.Claim); err != nil && !api.IsCode(err, api.CodeNotFound) {
			return err
		}
	}
	if err := d.removeCDISpec(uid); err != nil {
		return err
	}
	return d.state.remove(uid)
}
