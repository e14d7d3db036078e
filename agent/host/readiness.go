package host

import (
	"fmt"

	"github.com/gpuherd/gpuherd/vfio"
)

// An owner looks at every group a claim would bind before it touches any,
// and says which GPU and device refused it (docs/design.md, "Readiness for
// passthrough").

// NotReadyFailure is a claim refused before it changed anything: a GPU it
// would bind cannot be passed through now.
type NotReadyFailure struct {
	Claim, Addr string
	Verdict     vfio.Verdict
}

func (f *NotReadyFailure) Error() string {
	return fmt.Sprintf("claim %s: GPU %s cannot be passed through: %s; no driver binding on this server was changed, and other servers may still serve the request",
		f.Claim, f.Addr, f.Verdict.Reason())
}

// LookBeforeBind checks, with a fresh read, every GPU a claim would bind,
// before any of them is touched. A GPU found unusable is taken out of the
// offer at once. The caller holds the GPUs' device locks.
func (h *Host) LookBeforeBind(claim string, addrs []string) error {
	h.pass.mu.RLock()
	cfg := h.pass.cfg
	h.pass.mu.RUnlock()
	facts := h.pci.ReadHostFacts()
	var refused *NotReadyFailure
	for _, addr := range addrs {
		v, err := h.pci.Readiness(addr, cfg, &facts)
		if err != nil || v.Ready() {
			continue // unreadable: the bind fails and fences it, as before
		}
		if refused == nil {
			refused = &NotReadyFailure{Claim: claim, Addr: addr, Verdict: v}
		}
	}
	if refused == nil {
		return nil
	}
	h.NoteReadiness("claim "+claim, addrs)
	h.log.Warn("claim refused before any driver change", "claim", claim, "pci_address", refused.Addr, "reason", refused.Verdict.Reason())
	return refused
}
