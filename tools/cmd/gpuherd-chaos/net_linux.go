package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The test network: a "hub" namespace holding a bridge, and one namespace
// per agent joined to it by a veth pair (eth0 inside the agent's namespace,
// vhN on the hub). Addresses are 10.77.0.(10+N)/24. Nothing here touches
// the host's own interfaces or routes: every link is created inside the
// namespaces, and deleting the namespaces removes all of it.
//
// Faults are applied on the hub side only:
//   - isolate: `ip link set vhN down` (the node loses its carrier: fast
//     failures, like a pulled cable or a dead switch port);
//   - split partitions and packet loss: nftables rules in the hub's bridge
//     forward hook, one table per fault, so that healing one fault is
//     deleting its table (silent drops: the senders time out). tc netem
//     would do for loss too, but many kernels (this CI's included) are built
//     without sch_netem, while nf_tables with numgen is nearly everywhere.

const subnetPrefix = "10.77.0."

type network struct {
	prefix string // namespace name prefix, "ghc"
	n      int

	mu     sync.Mutex
	tables int // fault tables created, for unique names
}

func (nw *network) hub() string         { return nw.prefix + "-hub" }
func (nw *network) nodeNS(i int) string { return fmt.Sprintf("%s-n%d", nw.prefix, i) }
func nodeIP(i int) string               { return subnetPrefix + strconv.Itoa(10+i) }
func hubPort(i int) string              { return fmt.Sprintf("vh%d", i) }

// sh runs a command, returning its combined output in the error.
func sh(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// shIn runs a command with stdin.
func shIn(ctx context.Context, stdin string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// ours lists the namespaces that carry this program's prefix: this run's,
// or leftovers of a run that crashed.
func (nw *network) ours(ctx context.Context) ([]string, error) {
	out, err := sh(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], nw.prefix+"-") {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// teardown kills every process left in our namespaces (agents of a crashed
// run: processes this program started) by pid and deletes the namespaces,
// which removes their veths, the bridge and every fault rule.
func (nw *network) teardown(ctx context.Context) error {
	names, err := nw.ours(ctx)
	if err != nil {
		return err
	}
	var firstErr error
	for _, ns := range names {
		out, _ := sh(ctx, "ip", "netns", "pids", ns)
		for _, f := range strings.Fields(out) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for _, ns := range names {
		if _, err := sh(ctx, "ip", "netns", "del", ns); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// setup builds the hub, the bridge and one namespace per node.
func (nw *network) setup(ctx context.Context) error {
	hub := nw.hub()
	steps := [][]string{
		{"ip", "netns", "add", hub},
		{"ip", "-n", hub, "link", "set", "lo", "up"},
		{"ip", "-n", hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", hub, "link", "set", "br0", "up"},
	}
	for i := 1; i <= nw.n; i++ {
		ns := nw.nodeNS(i)
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", hub, "link", "add", hubPort(i), "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", hub, "link", "set", hubPort(i), "master", "br0"},
			[]string{"ip", "-n", hub, "link", "set", hubPort(i), "up"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", ns, "addr", "add", nodeIP(i) + "/24", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
		)
	}
	for _, s := range steps {
		if _, err := sh(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	// The fault tables are nftables bridge rules in the hub: check once that
	// this kernel and nft can do them, so that a missing feature fails the
	// setup rather than silently making every partition a no-op.
	name, err := nw.addTable(ctx, fmt.Sprintf("iifname %q oifname %q drop", hubPort(1), hubPort(1)))
	if err != nil {
		return fmt.Errorf("nftables bridge filtering in the hub namespace: %w", err)
	}
	return nw.delTable(ctx, name)
}

// addTable adds a bridge-family table in the hub with one forward chain
// holding rules, and returns its name.
func (nw *network) addTable(ctx context.Context, rules ...string) (string, error) {
	nw.mu.Lock()
	nw.tables++
	name := fmt.Sprintf("ghc_f%d", nw.tables)
	nw.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "table bridge %s {\n  chain filt {\n    type filter hook forward priority 0; policy accept;\n", name)
	for _, r := range rules {
		fmt.Fprintf(&b, "    %s\n", r)
	}
	b.WriteString("  }\n}\n")
	return name, shIn(ctx, b.String(), "ip", "netns", "exec", nw.hub(), "nft", "-f", "-")
}

func (nw *network) delTable(ctx context.Context, name string) error {
	_, err := sh(ctx, "ip", "netns", "exec", nw.hub(), "nft", "delete", "table", "bridge", name)
	return err
}

// setLink sets node i's hub-side veth up or down.
func (nw *network) setLink(ctx context.Context, i int, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	_, err := sh(ctx, "ip", "-n", nw.hub(), "link", "set", hubPort(i), state)
	return err
}

func portSet(nodes []int) string {
	parts := make([]string, len(nodes))
	for k, i := range nodes {
		parts[k] = strconv.Quote(hubPort(i))
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// partition drops every frame between the nodes of a and those of b.
func (nw *network) partition(ctx context.Context, a, b []int) (string, error) {
	return nw.addTable(ctx,
		fmt.Sprintf("iifname %s oifname %s drop", portSet(a), portSet(b)),
		fmt.Sprintf("iifname %s oifname %s drop", portSet(b), portSet(a)))
}

// loss drops pct% of the frames to and from each node of nodes.
func (nw *network) loss(ctx context.Context, nodes []int, pct int) (string, error) {
	return nw.addTable(ctx,
		fmt.Sprintf("iifname %s numgen random mod 100 < %d drop", portSet(nodes), pct),
		fmt.Sprintf("oifname %s numgen random mod 100 < %d drop", portSet(nodes), pct))
}

// healAll removes every fault: all links up, the hub's nftables flushed.
func (nw *network) healAll(ctx context.Context) error {
	var firstErr error
	for i := 1; i <= nw.n; i++ {
		if err := nw.setLink(ctx, i, true); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if _, err := sh(ctx, "ip", "netns", "exec", nw.hub(), "nft", "flush", "ruleset"); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}
