package gossip

// Learning a member's capacity from the member itself.
//
// A server that refuses a claim its view said it could hold answers with
// its current summary (LocalSummary). The coordinator puts that summary's
// capacity into its view at once (Learn) instead of waiting for the next
// re-advertisement, or running a full-state exchange (Refresh) that costs a
// TCP connection and the encoding and merging of every member's state on
// both sides.
//
// Only the capacity is taken (free counts and the ledger revision they go
// with), and only when it is newer than what the view holds for the same
// run of that agent (same Boot, higher Revision). Everything else about a
// member (its state, address, drain and leave flags, its part in the name
// registry) still comes from memberlist alone. A re-advertisement that
// memberlist delivers later but that the server encoded before the answer
// (a lower revision) does not take the view back.

// LocalSummary is this agent's summary as it would advertise it now, encoded;
// nil when it cannot be encoded or the agent is leaving.
func (c *Cluster) LocalSummary() []byte {
	if c.closing.Load() {
		return nil
	}
	meta, err := c.local().Encode()
	if err != nil {
		return nil
	}
	return meta
}

// Learn puts the capacity of meta, a summary that member name sent itself
// (its LocalSummary), into this agent's view, when the view lists that
// member alive or suspect, from the same run of its agent, with an older
// ledger revision. It reports whether the view took it; a summary that does
// not decode, or is not newer, changes nothing.
func (c *Cluster) Learn(name string, meta []byte) bool {
	s, err := DecodeSummary(meta)
	if err != nil {
		return false
	}
	return c.view.learn(name, s)
}

func (v *view) learn(name string, s Summary) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.members[name]
	if !ok || e.Self || e.SummaryErr != nil || (e.State != StateAlive && e.State != StateSuspect) {
		return false
	}
	if s.Boot != e.Summary.Boot || s.Revision <= e.Summary.Revision {
		return false
	}
	// A new Summary value: the one the list snapshot shares is never
	// modified.
	learned := e.Summary
	learned.Models, learned.Revision = s.Models, s.Revision
	e.Summary = learned
	v.notifyLocked(false)
	return true
}

// keepLearned is what alive stores for a member whose summary memberlist
// delivers as s: s, unless the view holds a newer capacity of the same run,
// learned from the member itself, which then stays.
func keepLearned(old, s Summary) Summary {
	if s.Boot == old.Boot && s.Revision < old.Revision {
		s.Models, s.Revision = old.Models, old.Revision
	}
	return s
}
