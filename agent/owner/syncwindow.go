package owner

import (
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/ledger"
)

// A claim's commit and its release each write twice: the ledger's record
// here, and the name registry's write (the hold, the name's release).
// Both must be durable before the answer, and the registry's is the slow
// one: a leader's append and a follower's, in sequence, and the request
// to the leader and back. The ledger's record is written at once, but its
// fdatasync need only end before the registry answers: started at once it
// is one fdatasync per write, however busy the ledger; started later, a
// commit or release of another claim on this ledger meanwhile (group
// commit's fdatasync, or another delayed one's) covers it for free
// (ledger.Unsynced.Durable). So the fdatasync waits for half of what the
// registry's writes from this server have taken lately, or until the
// registry answers, whichever comes first, and then runs if no other
// writer's ran. Half leaves the fdatasync the other half to end before
// the registry does; where it does not, the answer waits for the rest of
// one fdatasync, never more. A record alone (no other one waits beside a
// registry write) syncs at once, as before.

// nameWriteTime is a moving average of how long this owner's registry
// writes take, from their request to their answer.
type nameWriteTime struct {
	avg atomic.Int64 // nanoseconds; 0 until the first write
}

// syncLeadMax bounds the wait: a registry that answered slowly for a
// while (an election) does not make an fdatasync wait longer than this.
const syncLeadMax = 20 * time.Millisecond

// observe adds the duration of a registry write that succeeded.
func (n *nameWriteTime) observe(d time.Duration) {
	for {
		old := n.avg.Load()
		v := int64(d)
		if old != 0 {
			v = old + (int64(d)-old)/8
		}
		if n.avg.CompareAndSwap(old, v) {
			return
		}
	}
}

// lead is how long a ledger record written beside a registry write waits
// for another writer's fdatasync before it syncs itself.
func (n *nameWriteTime) lead() time.Duration {
	return min(time.Duration(n.avg.Load())/2, syncLeadMax)
}

// beside marks a registry write under way with a ledger record written
// beside it, for durableBeside: answered is closed by done, which the
// caller calls once the registry answered.
func (o *Owner) beside() (answered <-chan struct{}, done func()) {
	o.besides.Add(1)
	ch := make(chan struct{})
	return ch, func() {
		close(ch)
		o.besides.Add(-1)
	}
}

// durableBeside returns once written is durable, for a record written
// while a registry write is under way (beside). Alone (no other record of
// this owner waits for its registry write) it syncs at once: nobody is
// there to share with, and a later fdatasync would only meet the
// registry's own on a disk they share. Otherwise its fdatasync waits for
// the lead, or until answered is closed (the registry answered),
// whichever comes first, unless another writer's made the record durable
// by then.
func (o *Owner) durableBeside(written ledger.Unsynced, answered <-chan struct{}) error {
	if lead := o.nameTime.lead(); o.besides.Load() > 1 && lead > 0 {
		t := o.clk.NewTimer(lead)
		select {
		case <-answered:
		case <-t.C():
		}
		t.Stop()
	}
	return written.Durable()
}

// timedName runs a registry write and, when it succeeds, adds its
// duration to the owner's moving average.
func timedName[T any](o *Owner, write func() (T, error)) (T, error) {
	start := o.clk.Now()
	v, err := write()
	if err == nil {
		o.nameTime.observe(o.clk.Now().Sub(start))
	}
	return v, err
}
