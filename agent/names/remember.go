package names

import (
	"container/heap"
	"fmt"
	"time"
)

// Where a released claim ID last ran (docs/names.md, "Where an ID last
// ran"). A VM stopped and started again goes back to the server it ran on:
// the owner's release remembers that server for its remember_released
// (releaseMessage.Remember), and a hold with recall on another server is
// refused until then (CodeRecalled). Kept in the replicated state, so it
// survives any single server and every server decides the same; bounded,
// the oldest forgotten first; a hint, never a hold: nothing else waits on it.

// MaxRemember bounds how long a release may remember its server (the
// agent's remember_released allows up to 90 days).
const MaxRemember = 90 * 24 * time.Hour

// maxRemembered bounds how many released IDs the registry remembers; past
// it, the one that would be forgotten first goes now.
const maxRemembered = 100_000

// lastRun is where a released claim ID ran, until when it is remembered.
type lastRun struct {
	Owner string
	Until time.Time
}

// rememberedRun is a lastRun in a snapshot.
type rememberedRun struct {
	Key   Key       `json:"key"`
	Owner string    `json:"owner"`
	Until time.Time `json:"until"`
}

// forgetQueue orders remembered IDs by the time they are forgotten, then
// by key, so every server forgets the same ones in the same order. Entries
// are not removed when an ID is remembered again or held: one whose Until
// no longer matches the ID's is skipped when it comes up.
type forgetQueue []rememberedRun

func (q forgetQueue) Len() int { return len(q) }
func (q forgetQueue) Less(i, j int) bool {
	if !q[i].Until.Equal(q[j].Until) {
		return q[i].Until.Before(q[j].Until)
	}
	return compareKeys(q[i].Key, q[j].Key) < 0
}
func (q forgetQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *forgetQueue) Push(x any)   { *q = append(*q, x.(rememberedRun)) }
func (q *forgetQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// remember records that claim k ran on owner, until until.
func (s *state) remember(k Key, owner string, until time.Time) {
	s.recent[k] = lastRun{Owner: owner, Until: until}
	heap.Push(&s.forget, rememberedRun{Key: k, Owner: owner, Until: until})
	for len(s.recent) > maxRemembered {
		s.forgetFirst()
	}
	if len(s.forget) > 2*len(s.recent)+1024 {
		s.rebuildForget()
	}
}

// forgetPast forgets what is remembered only until now or before.
func (s *state) forgetPast(now time.Time) {
	for len(s.forget) > 0 && !now.Before(s.forget[0].Until) {
		s.dropQueued(heap.Pop(&s.forget).(rememberedRun))
	}
}

// forgetFirst forgets the ID that comes up first in the queue.
func (s *state) forgetFirst() {
	for len(s.forget) > 0 {
		if s.dropQueued(heap.Pop(&s.forget).(rememberedRun)) {
			return
		}
	}
}

// dropQueued forgets e's ID unless the ID outgrew the entry (remembered
// again since, or held).
func (s *state) dropQueued(e rememberedRun) bool {
	if lr, ok := s.recent[e.Key]; ok && lr.Until.Equal(e.Until) && lr.Owner == e.Owner {
		delete(s.recent, e.Key)
		return true
	}
	return false
}

func (s *state) rebuildForget() {
	q := make(forgetQueue, 0, len(s.recent))
	for k, lr := range s.recent {
		q = append(q, rememberedRun{Key: k, Owner: lr.Owner, Until: lr.Until})
	}
	heap.Init(&q)
	s.forget = q
}

// recalled refuses a hold of k on owner when k last ran on another server
// and is still remembered.
func (s *state) recalled(k Key, owner string) (Result, bool) {
	lr, ok := s.recent[k]
	if !ok || lr.Owner == owner || !s.now.Before(lr.Until) {
		return Result{}, false
	}
	return Result{Code: CodeRecalled, Record: &Record{Kind: k.Kind, Name: k.Name, Owner: lr.Owner, State: StateReleased},
		Detail: fmt.Sprintf("%s last ran on %s (remembered until %s); without any_node it goes back there", k, lr.Owner, lr.Until.UTC().Format(time.RFC3339))}, true
}

// rememberedRuns lists what is remembered, by key, for a snapshot.
func (s *state) rememberedRuns() []rememberedRun {
	keys := make([]Key, 0, len(s.recent))
	for k := range s.recent {
		keys = append(keys, k)
	}
	sortKeys(keys)
	out := make([]rememberedRun, len(keys))
	for i, k := range keys {
		out[i] = rememberedRun{Key: k, Owner: s.recent[k].Owner, Until: s.recent[k].Until}
	}
	return out
}
