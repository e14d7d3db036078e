package api

// Holder labels and annotations that tie gpuherd claims to Kubernetes
// (docs/kubevirt.md): the DRA driver reads them from the ledger, through
// the API, and writes them on what it creates.
const (
	// LabelKubernetes on a claim says its GPUs go to a Kubernetes pod (a
	// KubeVirt VM claimed first, `gpuherd claim --kubernetes`): the driver
	// publishes them with the claim's ID, for the VM's pinned
	// ResourceClaims alone. A claim without it or LabelResourceClaim
	// belongs to something outside Kubernetes (a libvirt VM) and its GPUs
	// are not published at all.
	LabelKubernetes = "gpuherd.io/kubernetes"
	// LabelResourceClaim is the namespace/name of the ResourceClaim a claim
	// was made for when its pod was prepared; LabelResourceClaimUID its UID.
	LabelResourceClaim    = "gpuherd.io/resourceclaim"
	LabelResourceClaimUID = "gpuherd.io/resourceclaim-uid"
	// AnnotationClaim on a ResourceClaim names the gpuherd claim whose GPUs
	// it is pinned to (claim first): its prepare then takes no new claim
	// but checks that the allocation is that claim's.
	AnnotationClaim = "gpuherd.io/claim"
)
