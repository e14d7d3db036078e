package agent

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/gpuherd/gpuherd/agent/pki"
)

// defaultNamesExpect is how many voters a registry without names_voters
// grows to.
const defaultNamesExpect = 3

// validateNames checks the name registry's keys (docs/names.md).
func (c *Config) validateNames() error {
	bad := func(key, format string, args ...any) error {
		return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	if c.GossipAddr == "" {
		for _, k := range []struct {
			key string
			set bool
		}{{"names_voters", len(c.NamesVoters) > 0}, {"names_addr", c.NamesAddr != ""}, {"names_dir", c.NamesDir != ""}} {
			if k.set {
				return bad(k.key, "needs gossip_addr: a server that runs alone keeps no name registry")
			}
		}
		return nil
	}
	switch n := len(c.NamesVoters); n {
	case 0, 1, 3, 5:
	default:
		return bad("names_voters", "%d voters: list 1, 3 or 5 node names (an even count tolerates no more failures than one fewer; 3 survive one failure, 5 two)", n)
	}
	for i, v := range c.NamesVoters {
		if err := pki.ValidateNodeName(v); err != nil {
			return bad("names_voters", "%q: %v", v, err)
		}
		if slices.Contains(c.NamesVoters[:i], v) {
			return bad("names_voters", "%q is listed twice", v)
		}
	}
	switch c.NamesBootstrapExpect {
	case 0, 1, 3, 5:
	default:
		return bad("names_bootstrap_expect", "%d: use 1, 3 or 5 (voters the registry grows to when names_voters is not set)", c.NamesBootstrapExpect)
	}
	if c.NamesAddr != "" {
		_, port, err := net.SplitHostPort(c.NamesAddr)
		if err != nil {
			return bad("names_addr", "%q: use HOST:PORT, e.g. 0.0.0.0:7948 (port 0 picks a free one)", c.NamesAddr)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return bad("names_addr", "port %q: use a number from 0 to 65535 (0 picks a free one)", port)
		}
	}
	if c.NamesDir != "" && !filepath.IsAbs(c.NamesDir) {
		return bad("names_dir", "%q is not an absolute path", c.NamesDir)
	}
	return nil
}

// namesAddr is where the registry's raft listens: names_addr, or the peer
// API's host on a free port.
func (c *Config) namesAddr() string {
	if c.NamesAddr != "" {
		return c.NamesAddr
	}
	host, _, err := net.SplitHostPort(c.PeerAddr)
	if err != nil {
		host = ""
	}
	return net.JoinHostPort(host, "0")
}

// namesDir holds the registry's raft state.
func (c *Config) namesDir() string {
	if c.NamesDir != "" {
		return c.NamesDir
	}
	return filepath.Join(c.DataDir, "names")
}

// namesExpect is the number of voters an automatic registry grows to.
func (c *Config) namesExpect() int {
	if c.NamesBootstrapExpect == 0 {
		return defaultNamesExpect
	}
	return c.NamesBootstrapExpect
}

// runsRaft reports whether this agent runs raft: always, unless
// names_voters is set and does not list it (it is then a client).
func (c *Config) runsRaft() bool {
	return len(c.NamesVoters) == 0 || slices.Contains(c.NamesVoters, c.NodeName)
}
