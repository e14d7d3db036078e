package gossip

// deadCount is how many members are dead: those listed as dead, and those
// forgotten from the list while dead that have not come back or left since.
// Members forgets a departed member after Config.RememberDeparted so that
// lookups stop naming it, but a server that is still down is still down:
// the gpuherd_gossip_members{state="dead"} gauge, and the alert on it, must
// not clear by themselves.
func (v *view) deadCount() int {
	members := v.list() // forgets what is due first
	v.mu.Lock()
	defer v.mu.Unlock()
	n := len(v.deadForgotten)
	for _, m := range members {
		if m.State == StateDead {
			n++
		}
	}
	return n
}

// DeadMembers is the number of members that are dead now, including those
// Members no longer lists (see Config.RememberDeparted).
func (c *Cluster) DeadMembers() int { return c.view.deadCount() }
