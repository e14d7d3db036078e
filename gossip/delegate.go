package gossip

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate connects memberlist's callbacks to the cluster. memberlist calls
// the event methods with its node lock held, so they only touch the view and
// never call back into memberlist.
type delegate struct {
	c *Cluster
}

var (
	_ memberlist.Delegate      = delegate{}
	_ memberlist.EventDelegate = delegate{}
	_ memberlist.PingDelegate  = delegate{}
	_ memberlist.AliveDelegate = delegate{}
)

// NodeMeta returns the encoded local summary. Encode already refused anything
// over memberlist.MetaMaxSize; the check here only keeps memberlist from
// panicking should that ever change.
func (d delegate) NodeMeta(limit int) []byte {
	meta := d.c.currentMeta()
	if len(meta) > limit {
		d.c.log.Error("gossip: capacity summary over the metadata limit; advertising none", "bytes", len(meta), "limit", limit)
		return nil
	}
	return meta
}

// NotifyMsg ignores user messages: capacity travels only in NodeMeta, and
// claims go over the peer API. It shares memberlist's receive queue with
// failure detection, so it must stay this cheap.
func (delegate) NotifyMsg([]byte) {}

// GetBroadcasts has nothing to send; see NotifyMsg.
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState adds nothing to push/pull: NodeMeta already carries the summary.
func (delegate) LocalState(join bool) []byte { return nil }

// MergeRemoteState has nothing to merge; see LocalState.
func (delegate) MergeRemoteState(buf []byte, join bool) {}

// NotifyJoin records a member that joined or came back.
func (d delegate) NotifyJoin(n *memberlist.Node) {
	d.c.view.alive(n.Name, n.Addr, n.Port, n.Meta)
	d.c.catchUp.note(n.Name)
}

// NotifyUpdate records a member's new summary.
func (d delegate) NotifyUpdate(n *memberlist.Node) {
	d.c.view.alive(n.Name, n.Addr, n.Port, n.Meta)
}

// NotifyLeave records a member that died or left.
func (d delegate) NotifyLeave(n *memberlist.Node) {
	d.c.view.gone(n.Name, n.Meta)
	d.c.catchUp.note(n.Name)
}

// AckPayload adds nothing to acks.
func (delegate) AckPayload() []byte { return nil }

// NotifyPingComplete ends this agent's suspicion of a member that answered a probe.
func (d delegate) NotifyPingComplete(other *memberlist.Node, _ time.Duration, _ []byte) {
	d.c.view.acked(other.Name)
}

// NotifyAlive sees every alive message, including a suspect's refutation,
// which memberlist reports with no event when the metadata is unchanged. It
// ends this agent's suspicion and never filters anyone out. An alive message
// still circulating from before the suspicion ends it too; that only shows
// the member alive a little longer, until its death is gossiped.
func (d delegate) NotifyAlive(n *memberlist.Node) error {
	d.c.view.acked(n.Name)
	return nil
}
