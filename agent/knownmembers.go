package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/registry"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/internal/atomicfile"
)

// The servers this agent has ever seen, kept on disk. Gossip only tells
// what it has heard since this agent started: restarted while a server
// holding claims was cut off, an agent never hears of that server (the
// others pass on dead members only to those that know them), and a list
// judged complete against gossip alone would leave its claims out without
// a word. A listing is complete only when every server of this list, and
// every owner the name registry records, answered or is known to have
// nothing (docs/protocol.md, "Complete listings").

// knownMembersFile holds the names, in the data directory.
const knownMembersFile = "members.json"

// knownMembers is the durable list of the servers this agent's gossip has
// seen alive, less those removed for good (members remove).
type knownMembers struct {
	path string
	// write stores the list; a test replaces it to fail.
	write func(path string, data []byte) error
	// failed reports a write's outcome to the storage health (nil: ok).
	failed func(op string, err error)

	mu    sync.Mutex
	names map[string]bool
}

type knownMembersDoc struct {
	Members []string `json:"members"`
}

// openKnownMembers reads the list. A file that cannot be read or parsed is
// logged and replaced at the next change: the list only ever widens what a
// listing waits for, and an agent must not refuse to start over it.
func (a *Agent) openKnownMembers() *knownMembers {
	k := &knownMembers{path: filepath.Join(a.cfg.DataDir, knownMembersFile), write: func(path string, data []byte) error { return atomicfile.Write(path, data, 0o600) }, names: map[string]bool{}}
	k.failed = func(op string, err error) { a.storageResult(storeMembers, op, err) }
	data, err := os.ReadFile(k.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return k
	case err != nil:
		a.log.Warn("known members list unreadable; listings are judged against gossip and the name registry until it is written again", "file", k.path, "err", err)
		a.storageResult(storeMembers, "read", err)
		return k
	}
	var doc knownMembersDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		a.log.Warn("known members list corrupt; it is written again at the next change", "file", k.path, "err", err)
		return k
	}
	for _, n := range doc.Members {
		if n != a.cfg.NodeName && registry.IsServerName(n) {
			k.names[n] = true
		}
	}
	return k
}

// list is the known servers, sorted.
func (k *knownMembers) list() []string {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]string, 0, len(k.names))
	for n := range k.names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// add records servers; it writes only when one is new.
func (k *knownMembers) add(names []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	changed := false
	for _, n := range names {
		if !k.names[n] {
			k.names[n] = true
			changed = true
		}
	}
	if changed {
		k.storeLocked()
	}
}

// forget drops a server removed for good.
func (k *knownMembers) forget(name string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.names[name] {
		delete(k.names, name)
		k.storeLocked()
	}
}

func (k *knownMembers) storeLocked() {
	doc := knownMembersDoc{Members: make([]string, 0, len(k.names))}
	for n := range k.names {
		doc.Members = append(doc.Members, n)
	}
	slices.Sort(doc.Members)
	data, _ := json.Marshal(doc)
	err := k.write(k.path, data)
	if err != nil {
		err = fmt.Errorf("writing %s: %w", k.path, err)
	}
	k.failed("write", err)
}

// forgetGoneEvery is how often watchMembers looks for members gossip has
// forgotten even when nothing else changed: gossip forgets a departed
// member when asked for its list after RememberDeparted, which tells no
// subscriber.
const forgetGoneEvery = 10 * time.Minute

// watchMembers follows the membership: every member gossip sees alive is
// added to the known list as soon as it is seen, and what this agent keeps
// per member is dropped once gossip no longer lists it
// (clusterState.forgetGone).
func (a *Agent) watchMembers(ctx context.Context) {
	c := a.cluster
	sub, cancel := c.g.SubscribeMembers()
	defer cancel()
	tick := a.clk.NewTicker(forgetGoneEvery)
	defer tick.Stop()
	for {
		members := c.g.Members()
		var seen []string
		for _, m := range members {
			if !m.Self && m.State == gossip.StateAlive {
				seen = append(seen, m.Name)
			}
		}
		c.known.add(seen)
		c.forgetGone(members)
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		case _, ok := <-sub:
			if !ok {
				return
			}
		}
	}
}

// unseenKnown is the known servers this agent's gossip does not list at
// all: not heard of since it started, or forgotten since they went away.
func (c *clusterState) unseenKnown() []string {
	inView := map[string]bool{}
	for _, m := range c.g.Members() {
		inView[m.Name] = true
	}
	var out []string
	for _, n := range c.known.list() {
		if !inView[n] {
			out = append(out, n)
		}
	}
	return out
}
