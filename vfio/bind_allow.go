package vfio

import "slices"

// SetAllowList replaces the vendor:device IDs the Binder may move, as a
// configuration reload does. Calls already planning keep the list they read.
func (b *Binder) SetAllowList(l AllowList) {
	b.allowMu.Lock()
	b.allow = slices.Clone(l)
	b.allowMu.Unlock()
}

// AllowList returns the list the Binder applies now.
func (b *Binder) AllowList() AllowList { return slices.Clone(b.allowList()) }

func (b *Binder) allowList() AllowList {
	b.allowMu.RLock()
	defer b.allowMu.RUnlock()
	return b.allow
}
