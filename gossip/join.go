package gossip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"
)

// maxJoinBackoff caps the wait between join attempts, so a server that comes
// up before all seeds still joins within about a minute of the first seed.
const maxJoinBackoff = time.Minute

// Join contacts the configured seeds until at least one of them answers,
// retrying with doubling, jittered waits, until ctx ends or JoinRetryMax
// attempts failed. An attempt in progress is not interrupted; memberlist
// bounds it by its TCP timeout. Seeds naming this agent itself are skipped,
// so every server can share one seed list; with no other seed, Join returns
// at once and this agent waits for others to join it.
func (c *Cluster) Join(ctx context.Context) error {
	seeds := c.otherSeeds()
	if len(seeds) == 0 {
		c.log.Info("no gossip seed to join; waiting for other servers to join this one")
		return nil
	}
	wait := c.retry
	for attempt := 1; ; attempt++ {
		if c.closing.Load() {
			return errors.New("gossip: join after leave or shutdown")
		}
		n, err := c.ml.Join(seeds)
		err = oneLine(err)
		if n > 0 {
			c.log.Info("joined the gossip cluster", "seeds_answered", n, "attempt", attempt)
			return nil
		}
		if c.retries > 0 && attempt >= c.retries {
			return fmt.Errorf("gossip: no seed of %v answered after %d attempts: %w; check --join, the gossip port and that every server has the same gossip key", seeds, attempt, err)
		}
		// One line per attempt: the interval keeps it from flooding the log.
		c.log.Warn("no gossip seed answered; retrying", "seeds", seeds, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(jitter(wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gossip: join %v: %w (last error: %v)", seeds, ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, maxJoinBackoff)
	}
}

// jitter spreads d by ±10% so servers restarted together do not retry in step.
func jitter(d time.Duration) time.Duration {
	spread := int64(d) / 5
	if spread <= 0 {
		return d
	}
	return d - time.Duration(spread/2) + time.Duration(rand.Int64N(spread))
}

// otherSeeds drops seeds that are this agent's own gossip address.
func (c *Cluster) otherSeeds() []string {
	selfPort := strconv.Itoa(int(c.selfPort))
	var out []string
	for _, s := range c.seeds {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			host, port = s, selfPort // memberlist's default port is our own
		}
		if ip := net.ParseIP(host); ip != nil && ip.Equal(c.selfIP) && port == selfPort {
			continue
		}
		out = append(out, s)
	}
	return out
}

// oneLine flattens memberlist's multi-line, per-seed join error into one line
// for logs and messages.
func oneLine(err error) error {
	var multi interface{ WrappedErrors() []error }
	if !errors.As(err, &multi) {
		return err
	}
	parts := make([]string, 0, len(multi.WrappedErrors()))
	for _, e := range multi.WrappedErrors() {
		parts = append(parts, e.Error())
	}
	return errors.New(strings.Join(parts, "; "))
}
