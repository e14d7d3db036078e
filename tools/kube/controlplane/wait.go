package controlplane

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
)

// Scheduled is what WaitScheduled found: the pod bound to a node and its
// claims allocated.
type Scheduled struct {
	Pod      *v1.Pod
	NodeName string
	// Claims are the pod's ResourceClaims in the order of
	// pod.spec.resourceClaims, each with status.allocation set.
	Claims []*resourceapi.ResourceClaim
}

// Claim returns the claim behind the pod-level claim name podClaimName.
func (s *Scheduled) Claim(podClaimName string) *resourceapi.ResourceClaim {
	for i, pc := range s.Pod.Spec.ResourceClaims {
		if pc.Name == podClaimName {
			return s.Claims[i]
		}
	}
	return nil
}

// boundedContext applies defaultWaitTimeout when ctx has no deadline.
func boundedContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultWaitTimeout)
}

// watchOne watches the single object namespace/name of a resource through an
// informer (so a dropped watch is resumed) until cond is true for it. cond
// sees nil once the object is deleted.
func watchOne[T runtime.Object](ctx context.Context, lw *cache.ListWatch, obj T, cond func(obj T, exists bool) (bool, error)) error {
	// The precondition sees the initial list, so that an object that
	// does not exist (any more) is noticed too, not only its deletion.
	precondition := func(store cache.Store) (bool, error) {
		items := store.List()
		if len(items) == 0 {
			var zero T
			return cond(zero, false)
		}
		o, ok := items[0].(T)
		if !ok {
			return false, fmt.Errorf("unexpected object %T", items[0])
		}
		return cond(o, true)
	}
	_, err := watchtools.UntilWithSync(ctx, lw, obj, precondition, func(ev watch.Event) (bool, error) {
		switch ev.Type {
		case watch.Deleted:
			var zero T
			return cond(zero, false)
		case watch.Added, watch.Modified:
			o, ok := ev.Object.(T)
			if !ok {
				return false, fmt.Errorf("unexpected object %T", ev.Object)
			}
			return cond(o, true)
		}
		return false, nil
	})
	return err
}

func (cp *ControlPlane) podListWatch(namespace, name string) *cache.ListWatch {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	pods := cp.Client.CoreV1().Pods(namespace)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return pods.Watch(ctx, o)
		},
	}
}

func (cp *ControlPlane) claimListWatch(namespace, name string) *cache.ListWatch {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	claims := cp.Client.ResourceV1().ResourceClaims(namespace)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return claims.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return claims.Watch(ctx, o)
		},
	}
}

func podScheduledCondition(pod *v1.Pod) *v1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == v1.PodScheduled {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// podClaimNames maps pod.spec.resourceClaims to ResourceClaim names; ok is
// false while the ResourceClaim controller has not yet recorded a claim
// generated from a template.
func podClaimNames(pod *v1.Pod) (names []string, ok bool) {
	for _, pc := range pod.Spec.ResourceClaims {
		switch {
		case pc.ResourceClaimName != nil:
			names = append(names, *pc.ResourceClaimName)
		default:
			found := false
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					names = append(names, *st.ResourceClaimName)
					found = true
				}
			}
			if !found {
				return nil, false
			}
		}
	}
	return names, true
}

// WaitScheduled waits until pod (namespace and name are used) is bound to a
// node and every claim in its spec.resourceClaims has status.allocation.
// While the pod is unschedulable it keeps waiting (a slice may still come),
// and the error on timeout quotes the scheduler's last message. Without a
// deadline on ctx it gives up after a minute.
func (cp *ControlPlane) WaitScheduled(ctx context.Context, pod *v1.Pod) (*Scheduled, error) {
	ctx, cancel := boundedContext(ctx)
	defer cancel()
	var (
		got     *v1.Pod
		names   []string
		lastMsg string
	)
	err := watchOne(ctx, cp.podListWatch(pod.Namespace, pod.Name), &v1.Pod{}, func(p *v1.Pod, exists bool) (bool, error) {
		if !exists {
			return false, fmt.Errorf("pod %s/%s does not exist (any more)", pod.Namespace, pod.Name)
		}
		if c := podScheduledCondition(p); c != nil && c.Status == v1.ConditionFalse {
			lastMsg = c.Message
		}
		var ok bool
		names, ok = podClaimNames(p)
		got = p
		return p.Spec.NodeName != "" && ok, nil
	})
	if err != nil {
		if lastMsg != "" {
			return nil, fmt.Errorf("pod %s/%s not scheduled (last PodScheduled=False message: %q): %w", pod.Namespace, pod.Name, lastMsg, err)
		}
		return nil, fmt.Errorf("pod %s/%s not scheduled: %w", pod.Namespace, pod.Name, err)
	}
	s := &Scheduled{Pod: got, NodeName: got.Spec.NodeName}
	for _, name := range names {
		var claim *resourceapi.ResourceClaim
		err := watchOne(ctx, cp.claimListWatch(pod.Namespace, name), &resourceapi.ResourceClaim{}, func(c *resourceapi.ResourceClaim, exists bool) (bool, error) {
			if !exists {
				return false, fmt.Errorf("claim %s/%s does not exist (any more)", pod.Namespace, name)
			}
			claim = c
			return c.Status.Allocation != nil, nil
		})
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s of scheduled pod %s not allocated: %w", pod.Namespace, name, pod.Name, err)
		}
		s.Claims = append(s.Claims, claim)
	}
	return s, nil
}

// WaitUnschedulable waits until the scheduler marks pod PodScheduled=False
// and returns the condition's message, e.g. "0/2 nodes are available: 2
// cannot allocate all claims. …". It fails if the pod gets a node instead.
func (cp *ControlPlane) WaitUnschedulable(ctx context.Context, pod *v1.Pod) (string, error) {
	ctx, cancel := boundedContext(ctx)
	defer cancel()
	var msg string
	err := watchOne(ctx, cp.podListWatch(pod.Namespace, pod.Name), &v1.Pod{}, func(p *v1.Pod, exists bool) (bool, error) {
		if !exists {
			return false, fmt.Errorf("pod %s/%s does not exist (any more)", pod.Namespace, pod.Name)
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s/%s was scheduled to %s", pod.Namespace, pod.Name, p.Spec.NodeName)
		}
		if c := podScheduledCondition(p); c != nil && c.Status == v1.ConditionFalse {
			msg = c.Message
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("pod %s/%s never became unschedulable: %w", pod.Namespace, pod.Name, err)
	}
	return msg, nil
}

// WaitDeallocated waits until the claim namespace/name has no
// status.allocation or is gone (claims made from a template are deleted
// with their pod), which the ResourceClaim controller does once no pod in
// status.reservedFor exists or runs any more.
func (cp *ControlPlane) WaitDeallocated(ctx context.Context, namespace, name string) error {
	ctx, cancel := boundedContext(ctx)
	defer cancel()
	err := watchOne(ctx, cp.claimListWatch(namespace, name), &resourceapi.ResourceClaim{}, func(c *resourceapi.ResourceClaim, exists bool) (bool, error) {
		return !exists || c.Status.Allocation == nil, nil
	})
	if err != nil {
		return fmt.Errorf("claim %s/%s still allocated: %w", namespace, name, err)
	}
	return nil
}

// SetPodPhase writes status.phase (e.g. Running, Succeeded, Failed) as a
// kubelet would; with no kubelet this is how a test moves a pod on. A pod
// that Succeeded or Failed releases its claims.
func (cp *ControlPlane) SetPodPhase(ctx context.Context, pod *v1.Pod, phase v1.PodPhase) (*v1.Pod, error) {
	cur, err := cp.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	cur.Status.Phase = phase
	if phase == v1.PodRunning && cur.Status.StartTime == nil {
		now := metav1.Now()
		cur.Status.StartTime = &now
	}
	return cp.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
}

// DeletePod deletes pod at once (grace period 0: no kubelet would ever
// confirm a graceful deletion) and waits until it is gone.
func (cp *ControlPlane) DeletePod(ctx context.Context, pod *v1.Pod) error {
	ctx, cancel := boundedContext(ctx)
	defer cancel()
	err := cp.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = watchOne(ctx, cp.podListWatch(pod.Namespace, pod.Name), &v1.Pod{}, func(_ *v1.Pod, exists bool) (bool, error) {
		return !exists, nil
	})
	if err == nil {
		return nil
	}
	return fmt.Errorf("pod %s/%s not gone: %w", pod.Namespace, pod.Name, err)
}
