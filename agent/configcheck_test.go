package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/pki"
)

func TestConfigUnknownKeyNamesTheClosest(t *testing.T) {
	cfg := DefaultConfig()
	err := decodeConfig([]byte("metrics_adr: :9465\nsocket_grup: gpuherd\nzzz_qqq: 1\nmodels:\n  - name: X\n    memory_gig: 4\n"), &cfg)
	var many *ConfigErrors
	if !errors.As(err, &many) || len(many.Errs) != 4 {
		t.Fatalf("want 4 problems, got %v", err)
	}
	for i, want := range []string{
		"unknown key metrics_adr (line 1): did you mean metrics_addr?",
		"unknown key socket_grup (line 2): did you mean socket_group?",
		"unknown key zzz_qqq (line 3)",
		"unknown key models[0].memory_gig (line 6): did you mean memory_gb?",
	} {
		if got := many.Errs[i].Error(); got != want {
			t.Errorf("problem %d: %q, want %q", i, got, want)
		}
	}
}

func TestConfigOfferedModelsAgainstTheCatalog(t *testing.T) {
	cfg := DefaultConfig()
	cfg.OfferedModels = []string{"l40s", "NVIDIA L40S", "h100 80gb"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cat, _ := cfg.Catalog()
	got, _ := cfg.canonicalOffered(cat)
	if want := []string{"NVIDIA L40S", "NVIDIA H100 80GB"}; !slices.Equal(got, want) {
		t.Errorf("canonical offered models %q, want %q (one model per name)", got, want)
	}
	cfg.OfferedModels = []string{"l40s", "Z9000"}
	err := cfg.Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "offered_models" || !strings.Contains(err.Error(), `"Z9000"`) {
		t.Errorf("Z9000: %v", err)
	}
	// An operator model makes it known.
	cfg.Models = []ModelConfig{{Name: "Z9000", DeviceIDs: []string{"ffee"}, MemoryGB: 64}}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Z9000 under models: %v", err)
	}
	cat, err = cfg.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := cat.ByDeviceID(0xffee); !ok || m.Name != "Z9000" || m.MemoryBytes != 64<<30 {
		t.Errorf("operator model: %+v %v", m, ok)
	}
	cfg.Models = []ModelConfig{{Name: "Z9000", DeviceIDs: []string{"ffee"}}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "memory_gb") {
		t.Errorf("a model without memory: %v", err)
	}
}

func TestConfigValues(t *testing.T) {
	for _, tt := range []struct {
		key    string
		adjust func(*Config)
	}{
		{"node_name", func(c *Config) { c.NodeName = "gpu\x1b[2J" }},
		{"node_name", func(c *Config) { c.NodeName = "gpu\u0085x" }},
		{"deny_devices", func(c *Config) { c.DenyDevices = []string{"3b:00.0"} }},
		{"fabric_mode", func(c *Config) { c.FabricMode = "nvlink" }},
		{"metrics_web_config", func(c *Config) { c.MetricsWebConfig = "/etc/web.yml" }},
		{"join", func(c *Config) { c.GossipAddr, c.Join = "127.0.0.1:7946", []string{"gpu-1:http"} }},
		{"join", func(c *Config) { c.GossipAddr, c.Join = "127.0.0.1:7946", []string{"gpu 1"} }},
	} {
		cfg := DefaultConfig()
		tt.adjust(&cfg)
		var ce *ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Key != tt.key {
			t.Errorf("%s: %v", tt.key, err)
		}
	}
}

// clusterFiles issues a CA and a certificate for node into dir.
func clusterFiles(t *testing.T, dir, node string) (ca, cert, key string) {
	t.Helper()
	if err := pki.CreateCA(filepath.Join(dir, "ca"), "test CA", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := pki.IssueCert(filepath.Join(dir, "ca"), filepath.Join(dir, "certs"), node, []string{"127.0.0.1"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "ca", "ca.crt"), filepath.Join(dir, "certs", node+".crt"), filepath.Join(dir, "certs", node+".key")
}

func TestConfigCheckHost(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := clusterFiles(t, dir, "gpu-1")
	keyFile := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef0123456789A=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() Config {
		c := DefaultConfig()
		c.NodeName = "gpu-1"
		c.DataDir = filepath.Join(dir, "data")
		c.Socket = filepath.Join(dir, "run", "gpuherd.sock")
		c.GossipAddr, c.PeerAddr = "127.0.0.1:7946", "127.0.0.1:7947"
		c.TLSCA, c.TLSCert, c.TLSKey = ca, cert, key
		c.GossipKeyFile = keyFile
		return c
	}
	good := base()
	if err := good.Check(); err != nil {
		t.Fatalf("a good configuration: %v", err)
	}
	for _, tt := range []struct {
		name, key, want string
		adjust          func(*Config)
	}{
		{"missing group", "socket_group", "no group named", func(c *Config) { c.SocketGroup = "gpuherd-no-such-group" }},
		{"same port twice", "peer_addr", "each listener needs its own port", func(c *Config) { c.PeerAddr = "0.0.0.0:7946" }},
		{"relative data dir", "data_dir", "absolute", func(c *Config) { c.DataDir = "data" }},
		{"unknown profile", "simulate", "no-such-profile", func(c *Config) { c.Simulate = "no-such-profile" }},
		{"unknown interface", "advertise_interface", "nosuchif0", func(c *Config) { c.AdvertiseInterface = "nosuchif0" }},
		{"certificate of another node", "tls_cert", `names node "gpu-2"`, func(c *Config) {
			other := t.TempDir()
			if err := pki.IssueCert(filepath.Join(dir, "ca"), other, "gpu-2", []string{"127.0.0.1"}, time.Hour); err != nil {
				t.Fatal(err)
			}
			c.TLSCert, c.TLSKey = filepath.Join(other, "gpu-2.crt"), filepath.Join(other, "gpu-2.key")
		}},
		{"key readable by others", "tls_cert", "mode 0666", func(c *Config) {
			k := filepath.Join(t.TempDir(), "k.key")
			data, _ := os.ReadFile(key)
			if err := os.WriteFile(k, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(k, 0o666); err != nil {
				t.Fatal(err)
			}
			c.TLSKey = k
		}},
		{"gossip key readable by group", "gossip_key_file", "mode 0640", func(c *Config) {
			k := filepath.Join(t.TempDir(), "g.key")
			data, _ := os.ReadFile(keyFile)
			if err := os.WriteFile(k, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(k, 0o640); err != nil {
				t.Fatal(err)
			}
			c.GossipKeyFile = k
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.adjust(&c)
			err := c.Check()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Key != tt.key || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v; want a problem with %s saying %q", err, tt.key, tt.want)
			}
		})
	}
}

// offered_models written as people type them are one model with the
// catalog's, not a second Unavailable line.
func TestAvailabilityOfferedModelsByCatalogName(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.OfferedModels = []string{"l40s", "NVIDIA L40S", "h100 80gb"}
	a := startAgent(t, cfg, machine(t, "l40s-4", dir), nil)
	defer a.Close()
	av, err := a.Availability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range av.Models {
		got = append(got, m.Model)
		if m.Model == "NVIDIA L40S" && !m.Available {
			t.Errorf("L40S: %+v", m)
		}
	}
	if want := []string{"NVIDIA H100 80GB", "NVIDIA L40S"}; !slices.Equal(got, want) {
		t.Errorf("availability lists %q, want %q", got, want)
	}
}
