package agent

import (
	"errors"
	"strings"
	"testing"
)

// clusterConfig is a valid configuration of a cluster agent.
func clusterConfig() Config {
	cfg := DefaultConfig()
	cfg.NodeName = "gpu-a"
	cfg.GossipAddr = "0.0.0.0:7946"
	cfg.PeerAddr = "0.0.0.0:7947"
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = "/etc/gpuherd/tls/ca.crt", "/etc/gpuherd/tls/gpu-a.crt", "/etc/gpuherd/tls/gpu-a.key"
	cfg.InsecureGossip = true
	return cfg
}

func TestConfigNamesKeysRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		adjust func(*Config)
		key    string
		says   string
	}{
		{"two voters", func(c *Config) { c.NamesVoters = []string{"gpu-a", "gpu-b"} }, "names_voters", "1, 3 or 5"},
		{"seven voters", func(c *Config) { c.NamesVoters = []string{"a", "b", "c", "d", "e", "f", "g"} }, "names_voters", "1, 3 or 5"},
		{"a voter twice", func(c *Config) { c.NamesVoters = []string{"gpu-a", "gpu-b", "gpu-a"} }, "names_voters", "twice"},
		{"a voter that is no node name", func(c *Config) { c.NamesVoters = []string{"gpu-a", "gpu b", "gpu-c"} }, "names_voters", `"gpu b"`},
		{"an even bootstrap", func(c *Config) { c.NamesBootstrapExpect = 2 }, "names_bootstrap_expect", "1, 3 or 5"},
		{"a negative bootstrap", func(c *Config) { c.NamesBootstrapExpect = -1 }, "names_bootstrap_expect", "1, 3 or 5"},
		{"an address without a port", func(c *Config) { c.NamesAddr = "10.0.0.1" }, "names_addr", "HOST:PORT"},
		{"a port out of range", func(c *Config) { c.NamesAddr = "10.0.0.1:70000" }, "names_addr", "0 to 65535"},
		{"a relative directory", func(c *Config) { c.NamesDir = "names" }, "names_dir", "absolute"},
		{"voters on a lone server", func(c *Config) { c.GossipAddr, c.PeerAddr = "", ""; c.NamesVoters = []string{"gpu-a"} }, "names_voters", "gossip_addr"},
		{"an address on a lone server", func(c *Config) { c.GossipAddr, c.PeerAddr = "", ""; c.NamesAddr = ":7948" }, "names_addr", "gossip_addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := clusterConfig()
			tc.adjust(&cfg)
			err := cfg.Validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Key != tc.key || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("got %v, want an error on %s saying %q", err, tc.key, tc.says)
			}
		})
	}
}

func TestConfigNamesDefaults(t *testing.T) {
	cfg := clusterConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a cluster config without names_* keys: %v", err)
	}
	if got := cfg.namesAddr(); got != "0.0.0.0:0" {
		t.Errorf("names address %q, want peer_addr's host on port 0", got)
	}
	if got, want := cfg.namesDir(), cfg.DataDir+"/names"; got != want {
		t.Errorf("names dir %q, want %q", got, want)
	}
	if cfg.namesExpect() != 3 || !cfg.runsRaft() {
		t.Errorf("expect %d, runs raft %v", cfg.namesExpect(), cfg.runsRaft())
	}
	cfg.NamesVoters = []string{"gpu-b", "gpu-c", "gpu-d"}
	if err := cfg.Validate(); err != nil || cfg.runsRaft() {
		t.Errorf("an agent not among names_voters: %v, runs raft %v (want a client)", err, cfg.runsRaft())
	}
	cfg.NamesBootstrapExpect = 0
	if cfg.namesExpect() != 3 {
		t.Errorf("names_bootstrap_expect 0 means %d, want the default 3", cfg.namesExpect())
	}
	cfg.NamesAddr = "10.1.2.3:7948"
	if err := cfg.Validate(); err != nil || cfg.namesAddr() != "10.1.2.3:7948" {
		t.Errorf("a fixed names_addr: %v, %q", err, cfg.namesAddr())
	}
}

func TestConfigNamesAddrNeedsItsOwnPort(t *testing.T) {
	cfg := clusterConfig()
	cfg.NamesAddr = "0.0.0.0:7947" // peer_addr's
	err := cfg.CheckHost()
	if err == nil || !strings.Contains(err.Error(), "names_addr: port 7947 is also peer_addr's") {
		t.Errorf("names_addr on peer_addr's port: %v", err)
	}
}
