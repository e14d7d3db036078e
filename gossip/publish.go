package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// updateTimeout bounds how long one re-advertisement waits for memberlist to
// finish broadcasting it. A timeout is harmless: the alive message stays
// queued and goes out anyway; waiting only paces the next update.
const updateTimeout = 2 * time.Second

// Publish re-reads the local summary and, when its encoding changed, has it
// re-advertised. It returns at once: one background publisher calls
// memberlist's UpdateNode, and a burst of changes (many ledger writes in a
// row) is merged into as few re-advertisements as the gossip interval allows.
// An error means the new summary could not be encoded; the previous one stays
// advertised.
func (c *Cluster) Publish() error {
	meta, err := c.local().Encode()
	if err != nil {
		return fmt.Errorf("gossip: publish capacity summary (still advertising the previous one): %w", err)
	}
	c.metaMu.Lock()
	// Checked under metaMu so a Publish racing with Leave cannot replace the
	// leave announcement in the metadata.
	if c.closing.Load() {
		c.metaMu.Unlock()
		return errors.New("gossip: publish after leave or shutdown")
	}
	changed := !bytes.Equal(meta, c.meta)
	if changed {
		c.meta = meta
	}
	c.metaMu.Unlock()
	if changed {
		c.pub.kick()
	}
	return nil
}

// publisher is the single flight of UpdateNode calls. A pending flag (the
// buffered channel) absorbs every kick that arrives while an update is in
// progress or while it waits out the pacing interval; the next update then
// advertises whatever summary is newest at that moment.
type publisher struct {
	c    *Cluster
	pace time.Duration
	// again are the delays, after the last change, at which the summary is
	// advertised once more (see DefaultRebroadcast).
	again   []time.Duration
	log     *slog.Logger
	pending chan struct{}
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
	updates atomic.Int64 // UpdateNode calls for a change, for tests
	repeats atomic.Int64 // UpdateNode calls that advertised it again, for tests
}

// DefaultRebroadcast is when a changed summary is advertised again, after
// the change, unless a newer one came. memberlist retransmits an update a
// bounded number of times within a few gossip rounds: a member that missed
// them all (packet loss, a partition of a second) kept the old capacity
// until the next full-state exchange, 30 s on a LAN (60 s above 32
// members), and meanwhile ranked this server by it. Each repeat costs one
// broadcast of a few hundred bytes; a burst of changes is repeated once.
var DefaultRebroadcast = []time.Duration{2 * time.Second, 10 * time.Second}

func startPublisher(c *Cluster, pace time.Duration, again []time.Duration, log *slog.Logger) *publisher {
	p := &publisher{
		c:       c,
		pace:    pace,
		again:   again,
		log:     log,
		pending: make(chan struct{}, 1),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go p.run()
	return p
}

func (p *publisher) kick() {
	select {
	case p.pending <- struct{}{}:
	default:
	}
}

// stop ends the publisher and waits for an update in flight (at most
// updateTimeout). Safe to call more than once.
func (p *publisher) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.done
}

func (p *publisher) run() {
	defer close(p.done)
	pace := time.NewTimer(0)
	defer pace.Stop()
	again := time.NewTimer(time.Hour)
	again.Stop()
	defer again.Stop()
	next := len(p.again) // the repeat due next; none while it is len(p.again)
	for {
		repeat := false
		select {
		case <-p.quit:
			return
		case <-p.pending:
			next = 0
		case <-again.C:
			repeat = true
		}
		if repeat {
			p.repeats.Add(1)
		} else {
			p.updates.Add(1)
		}
		if err := p.c.ml.UpdateNode(updateTimeout); err != nil {
			p.log.Debug("capacity summary re-advertised, broadcast not yet complete", "err", err)
		}
		if next < len(p.again) {
			d := p.again[next]
			if next > 0 {
				d -= p.again[next-1]
			}
			again.Reset(max(d, 0))
			next++
		}
		// Pace updates to one per gossip interval: memberlist sends queued
		// messages only that often, so faster updates would just replace
		// each other in its queue.
		pace.Reset(p.pace)
		select {
		case <-p.quit:
			return
		case <-pace.C:
		}
	}
}
