package gossip

// forget drops a departed member from the view at once, and from the dead
// count: the operator declared it gone for good (gpuherd members remove),
// so lookups must stop naming it and the dead-member alert must clear. A
// member that is alive or suspect, or this agent, is kept: it answers, or
// may, and memberlist would bring it back with its next message anyway.
// It reports whether name was forgotten.
func (v *view) forget(name string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.members[name]
	if ok && (e.Self || e.State == StateAlive || e.State == StateSuspect) {
		return false
	}
	_, wasForgotten := v.deadForgotten[name]
	delete(v.deadForgotten, name)
	if ok {
		delete(v.members, name)
		v.notifyLocked(true)
	}
	return ok || wasForgotten
}

// Forget drops a dead or departed member from Members and from
// DeadMembers now, rather than after Config.RememberDeparted; a member that
// is alive or suspect is kept. Should the server come back, memberlist
// lists it again. It reports whether name was forgotten.
func (c *Cluster) Forget(name string) bool { return c.view.forget(name) }
